package stack

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The binaries Build makes are kept in a cache shared by every test process
// and every run, keyed by what they are built from: `go test ./...` runs a
// dozen packages that each need the devicemanager or the API server, and
// linking those once instead of once a package is minutes of a 2-core
// machine's suite. A key covers the Go version, the build's environment,
// go.sum and the content of every file of this module that the binaries'
// packages compile or embed, so a binary is never used for a source it was
// not built from.
//
// NODEPLUG_TEST_BIN_CACHE names the cache's directory (default: the user's
// cache dir, nodeplug/test-bin); "off" builds into each caller's directory
// as before.
const binCacheEnv = "NODEPLUG_TEST_BIN_CACHE"

// binCacheKeep is how many source versions the cache keeps; older ones go
// once they have not been used for binCacheIdle.
const (
	binCacheKeep = 3
	binCacheIdle = 30 * time.Minute
)

func binCacheDir() (string, bool) {
	switch v := os.Getenv(binCacheEnv); v {
	case "off":
		return "", false
	case "":
		base, err := os.UserCacheDir()
		if err != nil {
			return "", false
		}
		return filepath.Join(base, "nodeplug", "test-bin"), true
	default:
		return v, true
	}
}

// buildShared builds the named binaries into the cache, unless a process
// built them from the same sources before, and copies them into dir.
func buildShared(ctx context.Context, root, cacheDir, dir string, names []string) error {
	// One key for every binary of Packages, so that callers asking for
	// different sets share each binary.
	pkgs := make([]string, 0, len(Packages))
	for _, p := range Packages {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	key, err := processKey(ctx, root, pkgs)
	if err != nil {
		return err
	}
	keyDir := filepath.Join(cacheDir, key)
	if err := os.MkdirAll(keyDir, 0o755); err != nil {
		return fmt.Errorf("test binary cache: %w", err)
	}
	unlock, err := lockFile(ctx, keyDir+".lock")
	if err != nil {
		return err
	}
	defer unlock()
	var missing []string
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(keyDir, n)); err != nil {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		tmp, err := os.MkdirTemp(keyDir, ".build-")
		if err != nil {
			return fmt.Errorf("test binary cache: %w", err)
		}
		defer os.RemoveAll(tmp)
		if err := goBuild(ctx, root, tmp, missing); err != nil {
			return err
		}
		for _, n := range missing {
			if err := os.Rename(filepath.Join(tmp, n), filepath.Join(keyDir, n)); err != nil {
				return fmt.Errorf("test binary cache: %w", err)
			}
		}
	}
	now := time.Now()
	_ = os.Chtimes(keyDir, now, now) // marks it used, for prune
	for _, n := range names {
		if err := copyFile(filepath.Join(keyDir, n), filepath.Join(dir, n)); err != nil {
			return fmt.Errorf("test binary cache: %w", err)
		}
	}
	pruneBinCache(cacheDir, key)
	return nil
}

// keys remembers each module root's key for the life of the process: a
// test process's Build calls (chaos makes four) share one go list, and the
// sources do not change under a running test.
var keys sync.Map // root → string

func processKey(ctx context.Context, root string, pkgs []string) (string, error) {
	if k, ok := keys.Load(root); ok {
		return k.(string), nil
	}
	k, err := sourceKey(ctx, root, pkgs)
	if err != nil {
		return "", err
	}
	keys.Store(root, k)
	return k, nil
}

// sourceKey hashes what the binaries of pkgs are built from. (A change to
// any of them gives every binary a new key: simpler than a key a binary,
// and a source change rebuilds them in one go build anyway.)
func sourceKey(ctx context.Context, root string, pkgs []string) (string, error) {
	h := sha256.New()
	goEnv := exec.CommandContext(ctx, "go", "env", "GOVERSION", "GOOS", "GOARCH", "GOFLAGS", "GOEXPERIMENT", "GOAMD64", "GOARM64")
	goEnv.Dir = root
	goEnv.Env = buildEnv()
	out, err := goEnv.Output()
	if err != nil {
		return "", fmt.Errorf("go env: %w", err)
	}
	h.Write(out)
	for _, f := range []string{"go.mod", "go.sum"} {
		if err := hashFile(h, filepath.Join(root, f)); err != nil {
			return "", err
		}
	}
	// One line a package: not-main-module packages are named by their
	// module's version (go.sum pins their content); this module's by the
	// files they compile and embed.
	list := exec.CommandContext(ctx, "go", append([]string{"list", "-deps", "-f",
		`{{if not .Standard}}{{.ImportPath}}	{{if .Module}}{{.Module.Path}}@{{.Module.Version}}{{if .Module.Replace}}=>{{.Module.Replace.Path}}@{{.Module.Replace.Version}}{{end}}{{end}}	{{.Dir}}	{{join .GoFiles " "}} {{join .EmbedFiles " "}}{{end}}`},
		pkgs...)...)
	list.Dir = root
	list.Env = buildEnv()
	var stderr bytes.Buffer
	list.Stderr = &stderr
	out, err = list.Output()
	if err != nil {
		return "", fmt.Errorf("go list: %v\n%s", err, stderr.Bytes())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	sort.Strings(lines)
	for _, line := range lines {
		if line == "" {
			continue
		}
		fmt.Fprintln(h, line)
		fields := strings.SplitN(line, "\t", 4)
		if len(fields) != 4 {
			return "", fmt.Errorf("go list: unexpected line %q", line)
		}
		pkgDir, module := fields[2], fields[1]
		// This module's packages, and any replaced by a local directory
		// (a replacement with no version), by content.
		rel, err := filepath.Rel(root, pkgDir)
		inModule := err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
		localReplace := strings.Contains(module, "=>") && strings.HasSuffix(module, "@")
		if !inModule && !localReplace {
			continue
		}
		for _, f := range strings.Fields(fields[3]) {
			if err := hashFile(h, filepath.Join(pkgDir, f)); err != nil {
				return "", err
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:24], nil
}

func hashFile(h io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("test binary cache: %w", err)
	}
	defer f.Close()
	fmt.Fprintf(h, "%s\n", path)
	_, err = io.Copy(h, bufio.NewReader(f))
	return err
}

// lockFile takes an exclusive lock on path, waiting for it as long as ctx
// lasts.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("test binary cache: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("test binary cache: lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("test binary cache: waiting for %s: %w", path, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// copyFile copies an executable: each caller gets its own file, which it
// may move, replace or remove without touching the cache.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(tmp)
		return err
	}
	if err := out.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, dst)
}

// pruneBinCache removes the source versions past the binCacheKeep most
// recently used, once they have been idle for binCacheIdle (a version in
// use by another test process is never that old), and never keep, the
// one just used.
func pruneBinCache(cacheDir, keep string) {
	entries, err := os.ReadDir(cacheDir)
	if err != nil {
		return
	}
	type version struct {
		name string
		used time.Time
	}
	var vs []version
	for _, e := range entries {
		if !e.IsDir() || e.Name() == keep {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		vs = append(vs, version{e.Name(), info.ModTime()})
	}
	slices.SortFunc(vs, func(a, b version) int { return b.used.Compare(a.used) })
	for i, v := range vs {
		if i < binCacheKeep-1 || time.Since(v.used) < binCacheIdle {
			continue
		}
		os.RemoveAll(filepath.Join(cacheDir, v.name))
		os.Remove(filepath.Join(cacheDir, v.name+".lock"))
	}
}
