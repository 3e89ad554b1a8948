package server

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/manager"
)

// FuzzEndpointIdentity (issue 25, N2): registrations and deregistrations,
// in any order, of several paths to two live plugins' sockets (the
// sockets, hard links to them, a symlink) under three resource names.
// After every step no socket is live under two resources, and no resource
// has two live endpoints on one socket: an endpoint is its socket, not its
// path. Each input starts from nothing live.
func FuzzEndpointIdentity(f *testing.F) {
	e := newEnv(f, time.Minute)
	var names []string
	for _, n := range []string{"a", "b"} {
		p := e.plugin(n, sampleplugin.Options{Resource: "example.com/" + n, Devices: 2}, true)
		names = append(names, p.SocketPath())
		for _, alias := range []string{n + "-hl.sock", n + "-hl2.sock"} {
			hl := filepath.Join(e.dpDir, alias)
			if err := os.Link(p.SocketPath(), hl); err != nil {
				f.Fatal(err)
			}
			names = append(names, hl)
		}
	}
	sl := filepath.Join(e.dpDir, "a-sl.sock")
	if err := os.Symlink(names[0], sl); err != nil {
		f.Fatal(err)
	}
	names = append(names, sl)
	resources := []string{"example.com/r0", "example.com/r1", "example.com/r2"}
	// Each byte is a step: its low bits pick a path, the next a resource,
	// the top bit deregisters instead of registering.
	step := func(path, res int, dereg bool) byte {
		b := byte(path) | byte(res)<<3
		if dereg {
			b |= 0x80
		}
		return b
	}
	f.Add([]byte{step(0, 0, false), step(1, 1, false)})                    // a hard link under another resource
	f.Add([]byte{step(0, 0, false), step(6, 1, false)})                    // a symlink under another resource
	f.Add([]byte{step(0, 0, false), step(1, 0, false), step(2, 0, false)}) // same resource, three paths
	f.Add([]byte{step(1, 0, false), step(1, 0, true), step(2, 1, false)})  // gone, then another resource
	f.Add([]byte{step(3, 2, false), step(4, 2, false), step(0, 2, false)}) // two sockets, one resource
	f.Add([]byte{step(0, 0, false), step(0, 0, true), step(1, 1, false), step(0, 2, false)})
	f.Fuzz(func(t *testing.T, steps []byte) {
		if len(steps) > 16 {
			steps = steps[:16]
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		defer deregisterAll(ctx, t, e.m)
		for _, s := range steps {
			path, res := names[int(s&7)%len(names)], resources[int(s>>3&3)%len(resources)]
			if s&0x80 != 0 {
				id, _, err := unixsock.Stat(path)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = e.m.Deregister(ctx, res, path, id.Generation())
			} else {
				_ = e.m.Register(ctx, manager.Registration{Resource: res, Endpoint: path, Versions: []string{pluginapi.Version}, Path: manager.PathKubeletSock})
			}
			checkOneSocketOneResource(t, e.m)
		}
	})
}

// checkOneSocketOneResource fails t when a socket is live under two
// resources, or twice under one.
func checkOneSocketOneResource(t *testing.T, m *manager.Manager) {
	t.Helper()
	owner := map[unixsock.Key]string{}
	for _, r := range m.ListResources() {
		for _, ep := range r.Endpoints {
			if ep.State == manager.StateStopped {
				continue
			}
			id, _, err := unixsock.Stat(ep.Endpoint)
			if err != nil {
				t.Fatal(err)
			}
			if o, ok := owner[id.Key()]; ok {
				t.Fatalf("socket %v is live twice: under %s and under %s (%s)", id.Key(), o, r.Name, ep.Endpoint)
			}
			owner[id.Key()] = r.Name + " (" + ep.Endpoint + ")"
		}
	}
}

// deregisterAll deregisters every live endpoint of m.
func deregisterAll(ctx context.Context, t *testing.T, m *manager.Manager) {
	for _, r := range m.ListResources() {
		for _, ep := range r.Endpoints {
			if ep.State == manager.StateStopped {
				continue
			}
			if _, err := m.Deregister(ctx, r.Name, ep.Endpoint, ep.Generation); err != nil {
				t.Fatal(err)
			}
		}
	}
}
