// Package plugintest starts the example device plugin (internal/sampleplugin) in
// tests, stopped when the test ends. It is a package of its own so that
// testutil does not depend on the plugin library, whose own tests use
// testutil.
package plugintest

import (
	"testing"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
)

// Start creates a device plugin with opts, starts it and stops it when t
// ends. It fails t when the plugin cannot start.
func Start(t testing.TB, opts sampleplugin.Options) *sampleplugin.Plugin {
	t.Helper()
	p, err := sampleplugin.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatalf("start device plugin %s at %s: %v", opts.Resource, opts.SocketPath, err)
	}
	t.Cleanup(p.Stop)
	return p
}
