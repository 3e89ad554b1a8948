package main

import (
	"testing"

	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/refdoc"
)

// TestReference: docs/reference/config/dramanager.md is what the flag set of
// nodeplug-dramanager renders (make docs writes it).
func TestReference(t *testing.T) {
	err := refdoc.CheckStable("docs/reference/config/dramanager.md", t, func() (string, error) {
		return app.ServiceReference(appService(), nil)
	})
	if err != nil {
		t.Fatal(err)
	}
}
