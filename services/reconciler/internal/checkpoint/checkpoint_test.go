package checkpoint

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/services/internal/atomicfile"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
)

func reg(path, gen string) cache.Plugin {
	return cache.Plugin{SocketPath: path, Generation: gen, Type: "DevicePlugin", Name: "example.com/dev", Endpoint: path, Versions: []string{"v1beta1"}}
}

func open(t *testing.T, path string) *File {
	t.Helper()
	f, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return f
}

// What is put comes back byte for byte at the next Open, paths and names
// that are not UTF-8 or start with a quote included; a missing file is an
// empty one.
func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "registrations.json")
	f := open(t, path)
	if got := f.Loaded(); len(got) != 0 {
		t.Fatalf("a missing file loaded %+v", got)
	}
	odd := cache.Plugin{SocketPath: "/r/plugins_registry/\xff\xfe.sock", Generation: "1:2:3", Type: "DRAPlugin",
		Name: "\"quoted\"", Endpoint: "/r/plugins/\x80/dra.sock", Versions: []string{"v1.DRAPlugin", "v1beta1.DRAPlugin"}}
	f.Put(reg("/r/plugins_registry/a.sock", "1:1:1"))
	f.Put(odd)
	if err := f.Flush(); err != nil {
		t.Fatal(err)
	}
	got := open(t, path).Loaded()
	want := []cache.Plugin{reg("/r/plugins_registry/a.sock", "1:1:1"), odd}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("loaded %+v\nwant %+v", got, want)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the file's mode: %v, %v; want 0600", st.Mode(), err)
	}
}

// Delete forgets only the generation it names: a newer one put meanwhile
// stays.
func TestDeleteKeepsANewerGeneration(t *testing.T) {
	path := filepath.Join(t.TempDir(), "registrations.json")
	f := open(t, path)
	f.Put(reg("/s.sock", "1:1:1"))
	f.Put(reg("/s.sock", "1:1:2"))
	f.Delete("/s.sock", "1:1:1")
	if got := f.List(); len(got) != 1 || got[0].Generation != "1:1:2" {
		t.Fatalf("after deleting the old generation: %+v", got)
	}
	f.Delete("/s.sock", "1:1:2")
	if got := f.List(); len(got) != 0 {
		t.Fatalf("after deleting the current generation: %+v", got)
	}
}

// A file that cannot be read is an error naming why, and the File starts
// empty, to be written anew; nothing is read from it.
func TestUnreadableFiles(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	f := open(t, good)
	f.Put(reg("/a.sock", "1:1:1"))
	if err := f.Flush(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, content, want string
	}{
		{"not JSON", "{", "is not a registrations file"},
		{"another kind", `{"kind":"other","version":1}`, `is of kind "other"`},
		{"a later version", strings.Replace(string(b), `"version":1`, `"version":2`, 1), "version 2"},
		{"damaged", strings.Replace(string(b), "/a.sock", "/b.sock", 1), "is damaged"},
		{"a registration without its type", func() string {
			b, err := marshal([]cache.Plugin{{SocketPath: "/a.sock", Generation: "1:1:1"}})
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}(), "socket_path, generation and type must be set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := Open(path, Options{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open = %v, want an error containing %q", err, tc.want)
			}
			if f == nil || len(f.Loaded()) != 0 || len(f.List()) != 0 {
				t.Fatalf("an unreadable file gave %+v", f)
			}
		})
	}
	if err := os.Mkdir(filepath.Join(dir, "a-dir"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(filepath.Join(dir, "a-dir"), Options{}); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("Open of a directory = %v", err)
	}
}

// Run writes changes in the background, coalesced, and leaves no
// temporary file; Open removes one a crash left. A write that fails is
// retried.
func TestRunWrites(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "later")
	path := filepath.Join(dir, "registrations.json")
	// The directory does not exist yet: the first writes fail.
	f := open(t, path)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for i := range 200 {
		f.Put(reg(filepath.Join("/r", string(rune('a'+i%26))+".sock"), "1:1:1"))
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the 26 registrations on disk", func() bool {
		g, err := Open(path, Options{})
		return err == nil && len(g.Loaded()) == 26
	})
	f.Delete("/r/a.sock", "1:1:1")
	testutil.WaitFor(t, "the deletion on disk", func() bool {
		g, err := Open(path, Options{})
		return err == nil && len(g.Loaded()) == 25
	})
	matches, _ := filepath.Glob(filepath.Join(dir, ".*"))
	if len(matches) != 0 {
		t.Fatalf("temporary files left: %v", matches)
	}
	crashed := filepath.Join(dir, atomicfile.TempPrefix(path)+"0123")
	if err := os.WriteFile(crashed, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if g := open(t, path); len(g.Loaded()) != 25 {
		t.Fatalf("loaded %d registrations, want 25", len(g.Loaded()))
	}
	if _, err := os.Stat(crashed); !os.IsNotExist(err) {
		t.Fatalf("a crashed write's temporary file is left: %v", err)
	}
}
