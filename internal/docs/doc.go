// Package docs holds the documentation's tests: the README stays a front
// page (300 lines at most, opening with make run and make test), every
// relative link and image in the README and under docs/ points at a file
// that exists (and at a heading that exists, when it names one), and every
// guide in docs/ is listed in docs/README.md. Links into docs/reference/
// and docs/figures/, whose files are written by other programs, are
// checked only when their file exists.
//
// It has no code of its own; `go test ./internal/docs/` runs the checks.
package docs
