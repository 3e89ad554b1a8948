// Package version holds the build version, set by the linker.
package version

// Version is set at build time with -ldflags "-X github.com/nodeplug/nodeplug/pkg/version.Version=...".
var Version = "dev"
