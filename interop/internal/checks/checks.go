// Package checks records the named checks an interop program runs (a flow, a cell's step),
// prints each as it ends, and answers what became of one for the reports.
package checks

import (
	"fmt"
	"time"
)

// Check is one check's outcome: Detail is a line of figures or texts, Err its failure.
type Check struct {
	Name   string
	Err    error
	Detail string
}

// List is the checks of one row or cell, in the order they ran.
type List []Check

// Run runs f, records its outcome under name and prints it, the name padded to width.
func (l *List) Run(width int, name string, f func() (string, error)) {
	start := time.Now()
	detail, err := f()
	*l = append(*l, Check{Name: name, Err: err, Detail: detail})
	status := "ok"
	if err != nil {
		status = "FAIL: " + err.Error()
	}
	fmt.Printf("   %-*s %s (%d ms) %s\n", width, name, status, time.Since(start).Milliseconds(), detail)
}

// Find returns the check named name, and whether it ran.
func (l List) Find(name string) (Check, bool) {
	for _, c := range l {
		if c.Name == name {
			return c, true
		}
	}
	return Check{}, false
}
