package main

import (
	"testing"

	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/refdoc"
)

// TestReference: docs/reference/config/watcher.md is what the flag set of
// nodeplug-watcher renders (make docs writes it).
func TestReference(t *testing.T) {
	err := refdoc.CheckStable("docs/reference/config/watcher.md", t, func() (string, error) {
		return app.ServiceReference(appService(), nil)
	})
	if err != nil {
		t.Fatal(err)
	}
}
