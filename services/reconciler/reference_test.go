package main

import (
	"testing"

	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/refdoc"
)

// TestReference: docs/reference/config/reconciler.md is what the flag set of
// nodeplug-reconciler renders (make docs writes it).
func TestReference(t *testing.T) {
	err := refdoc.CheckStable("docs/reference/config/reconciler.md", t, func() (string, error) {
		return app.ServiceReference(appService(), nil)
	})
	if err != nil {
		t.Fatal(err)
	}
}
