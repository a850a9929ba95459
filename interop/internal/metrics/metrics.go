// Package metrics reads samples off a Prometheus text page, as the interop programs check what
// a proxy server counted.
package metrics

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ErrMissing is Sum's error when no sample matches.
var ErrMissing = errors.New("no such sample")

// Sum adds up every sample of name whose labels include all of want (`k="v"` pairs) on a
// Prometheus text page.
func Sum(page io.Reader, name string, want ...string) (float64, error) {
	sc := bufio.NewScanner(page)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var sum float64
	found := false
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		labels := ""
		if strings.HasPrefix(rest, "{") {
			end := strings.Index(rest, "}")
			if end < 0 {
				continue
			}
			labels, rest = rest[1:end], rest[end+1:]
		}
		match := true
		for _, w := range want {
			if !strings.Contains(","+labels+",", ","+w+",") {
				match = false
			}
		}
		if !match {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %v", name, line, err)
		}
		sum += v
		found = true
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if !found {
		return 0, ErrMissing
	}
	return sum, nil
}
