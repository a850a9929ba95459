// Package klogflags gives the upstream-wrapper binaries the same command-line
// surface as upstream's proxy-server / proxy-agent: the component's own
// pflags, plus klog's Go flags with '_' turned into '-' and -v defaulting to 4.
package klogflags

import (
	goflag "flag"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

// Execute adds component and klog flags to cmd, runs it and exits non-zero
// on error.
func Execute(cmd *cobra.Command, componentFlags *pflag.FlagSet) {
	fs := cmd.Flags()
	fs.AddFlagSet(componentFlags)

	kfs := goflag.NewFlagSet("klog", goflag.ExitOnError)
	klog.InitFlags(kfs)
	if err := kfs.Set("v", "4"); err != nil {
		fmt.Fprintf(os.Stderr, "cannot default -v: %v\n", err)
	}
	kfs.VisitAll(func(f *goflag.Flag) {
		f.Name = strings.ReplaceAll(f.Name, "_", "-")
		fs.AddGoFlag(f)
	})

	if err := cmd.Execute(); err != nil {
		klog.Errorf("%s failed: %v", cmd.Use, err)
		klog.Flush()
		os.Exit(1)
	}
}
