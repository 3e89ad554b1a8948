package nodename

import (
	"os"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	if got, err := Resolve("node-a"); err != nil || got != "node-a" {
		t.Fatalf("Resolve(node-a) = %q, %v", got, err)
	}
	if _, err := Resolve("Not_A_Node"); err == nil || !strings.Contains(err.Error(), "--node-name") {
		t.Fatalf("an invalid name: %v", err)
	}
	h, err := os.Hostname()
	if err != nil {
		t.Skip("no host name")
	}
	if got, err := Resolve(""); err != nil || got != strings.ToLower(h) {
		t.Fatalf("Resolve(\"\") = %q, %v; want the host name %q", got, err, strings.ToLower(h))
	}
}
