//! tether-client's egress selector: the loader against kube-apiserver's own (recorded in
//! `go-results.txt` by `interop/egress-golden.sh`), and dialing through real tether servers.

mod dial;
mod go_agrees;
