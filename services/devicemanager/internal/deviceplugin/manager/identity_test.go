package manager

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// TestReusedInodeIsAnotherSocket: a socket created after a live endpoint's
// socket was removed, before that endpoint's end was handled, can be
// given the freed inode (ext4 and overlayfs reuse them at once). It is
// another socket: it does not conflict with the endpoint still thought
// live, nor replace it; another path to the very same socket does both.
func TestReusedInodeIsAnotherSocket(t *testing.T) {
	c := newCore(Config{Log: slog.New(slog.DiscardHandler)})
	old := unixsock.Identity{Dev: 0x803, Ino: 4242, Birth: 1_000}
	reused := unixsock.Identity{Dev: 0x803, Ino: 4242, Birth: 2_000}
	noBirth := unixsock.Identity{Dev: 0x803, Ino: 4243, Mtime: 3_000}

	c.mu.Lock()
	defer c.mu.Unlock()
	live := &entry{resource: "example.com/a", path: "/plugins/a.sock", id: old}
	c.installLocked(live, time.Now())
	flat := &entry{resource: "example.com/c", path: "/plugins/c.sock", id: noBirth}
	c.installLocked(flat, time.Now())

	if err := c.conflictLocked("example.com/b", "/plugins/b.sock", reused); err != nil {
		t.Fatalf("a new socket on a reused inode refused as the live endpoint's: %v", err)
	}
	if e := c.sameEndpointLocked(c.resources["example.com/a"], "/plugins/b.sock", reused); e != nil {
		t.Fatalf("a new socket on a reused inode taken for the live endpoint at %s", e.path)
	}

	var conflict *EndpointConflictError
	err := c.conflictLocked("example.com/b", "/plugins/link-to-a.sock", old)
	if !errors.As(err, &conflict) || conflict.OtherPath != "/plugins/a.sock" || conflict.Other != "example.com/a" {
		t.Fatalf("another path to the live socket: %v; want a conflict naming /plugins/a.sock under example.com/a", err)
	}
	if e := c.sameEndpointLocked(c.resources["example.com/a"], "/plugins/link-to-a.sock", old); e != live {
		t.Fatalf("another path to the live socket did not meet its endpoint: %v", e)
	}

	// Where the filesystem records no birth time, the mtime tells them apart.
	if err := c.conflictLocked("example.com/b", "/plugins/d.sock", unixsock.Identity{Dev: 0x803, Ino: 4243, Mtime: 4_000}); err != nil {
		t.Fatalf("a new socket (no birth time) on a reused inode refused: %v", err)
	}
	if err := c.conflictLocked("example.com/b", "/plugins/link-to-c.sock", noBirth); !errors.As(err, &conflict) || conflict.OtherPath != "/plugins/c.sock" {
		t.Fatalf("another path to the live socket (no birth time): %v; want a conflict naming /plugins/c.sock", err)
	}
}
