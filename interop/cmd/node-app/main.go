// node-app is the test workload of the real node (interop/node): one static binary, standard
// library only, that plays every part a flow needs from a container. It picks its command from
// the name it was started as (the image links /bin/tar and /bin/test to it, because kubectl cp
// runs "tar" and "test") or else from its first argument:
//
//	serve                 HTTP on $PORT (default 8080): / answers, /healthz is the probe; a log
//	                      line at start and one per request
//	log-every DURATION    a numbered line per tick, for kubectl logs -f
//	cat                   stdin to stdout until EOF, for exec -i and attach -i
//	cat-file FILE         print FILE
//	tar c|x ...           enough of tar for kubectl cp (cf - PATH, xf - -C DIR)
//	test -d|-e|-f PATH    the check kubectl cp makes before copying into a directory
//	webhook               HTTPS admission webhook that allows every request and counts them,
//	                      and an aggregated API (flows.tether.dev/v1 pings)
//	hostname              the pod's hostname
//	id                    uid, gid, capabilities, NoNewPrivs, seccomp, whether / is writable
//	whoami                the pod's identity from the API, through the kubernetes Service
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type command struct {
	run   func(args []string) error
	usage string
}

var commands = map[string]command{
	"serve":     {serve, "serve"},
	"log-every": {logEvery, "log-every DURATION"},
	"cat":       {catStdin, "cat"},
	"cat-file":  {catFile, "cat-file FILE"},
	"tar":       {tarMain, "tar cf - PATH... | tar xf - [-C DIR]"},
	"test":      {testPath, "test -d|-e|-f PATH"},
	"webhook":   {webhook, "webhook [-cert FILE] [-key FILE] [-port N]"},
	"hostname":  {hostname, "hostname"},
	"id":        {identity, "id"},
	"whoami":    {whoami, "whoami"},
}

func main() {
	name, args := filepath.Base(os.Args[0]), os.Args[1:]
	cmd, ok := commands[name]
	if !ok {
		if len(args) == 0 {
			usage("no command given")
		}
		name, args = args[0], args[1:]
		if cmd, ok = commands[name]; !ok {
			usage(fmt.Sprintf("unknown command %q", name))
		}
	}
	if err := cmd.run(args); err != nil {
		fmt.Fprintf(os.Stderr, "node-app %s: %v\n", name, err)
		os.Exit(1)
	}
}

func usage(why string) {
	var lines []string
	for _, c := range commands {
		lines = append(lines, "  node-app "+c.usage)
	}
	sort.Strings(lines)
	fmt.Fprintf(os.Stderr, "node-app: %s; commands (or start it as a link named like one):\n%s\n", why, strings.Join(lines, "\n"))
	os.Exit(2)
}
