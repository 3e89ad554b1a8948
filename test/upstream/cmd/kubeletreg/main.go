// Command kubeletreg runs the kubelet's own plugin manager, with the
// kubelet's DRA plugin manager and device manager as its handlers, on a
// plugins_registry directory until SIGTERM (see package kubeletreg). It is
// the kubelet that nodeplug-bench's floor phase measures beside nodeplug:
//
//	unshare -m kubeletreg -dir /tmp/reg -kubelet-root /tmp/kubelet
package main

import (
	"os"

	"github.com/nodeplug/nodeplug/test/upstream/kubeletreg"
)

func main() {
	os.Exit(kubeletreg.Main(os.Args[1:], os.Stdout, os.Stderr))
}
