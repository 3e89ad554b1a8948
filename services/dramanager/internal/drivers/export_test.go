package drivers

import "k8s.io/apimachinery/pkg/util/wait"

// SetWipeBackoff makes the deletions' retries follow b until the test
// ends; set it before the registry is made.
func SetWipeBackoff(t interface{ Cleanup(func()) }, b wait.Backoff) {
	old := wipeBackoff
	wipeBackoff = b
	t.Cleanup(func() { wipeBackoff = old })
}
