package manager

// Identity: an endpoint is its socket's (device, inode), not its path
// (DESIGN "Identity"). The index of live endpoints finds them by both, so
// that a registration naming another path to a live endpoint's socket (a
// hard link, an allowed symlink) meets that endpoint. The socket is matched
// by its whole unixsock.Identity (device, inode and birth time, or mtime
// where the filesystem has none), not by (device, inode) alone: a socket
// created after a live endpoint's socket was removed, but before its
// connection's end was handled, can be given the freed inode, and is
// another socket. Everything here runs under the state core's mutex.

import (
	"fmt"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/kubeletrules"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// EndpointConflictError refuses a registration that names an endpoint live
// under another resource: one live endpoint serves one resource, or the
// same devices would be allocatable twice. It wraps
// errdefs.ErrAlreadyExists. conflictLocked returns it inside a
// kubeletrules.Error with the kubelet's words for a socket it already
// serves.
type EndpointConflictError struct {
	Endpoint  string // as registered
	Resource  string // what the registration asked for
	Other     string // the resource the endpoint serves
	OtherPath string // the path it serves it on: Endpoint, or another path to its socket
}

func (e *EndpointConflictError) Error() string {
	if e.OtherPath != "" && e.OtherPath != e.Endpoint {
		return fmt.Sprintf("endpoint %s is the socket of endpoint %s, live under resource %s, so it cannot serve %s: one endpoint serves one resource",
			e.Endpoint, e.OtherPath, e.Other, e.Resource)
	}
	return fmt.Sprintf("endpoint %s is live under resource %s, so it cannot serve %s: one endpoint serves one resource",
		e.Endpoint, e.Other, e.Resource)
}

// Unwrap makes the error errdefs.ErrAlreadyExists.
func (e *EndpointConflictError) Unwrap() error { return errdefs.ErrAlreadyExists }

// conflictLocked returns an *EndpointConflictError (in a kubeletrules.Error) when the endpoint at
// path, or any endpoint whose socket is id (another path to it: a hard
// link, a symlink), is live (not closed) under a resource other than
// resource.
func (c *core) conflictLocked(resource, path string, id unixsock.Identity) error {
	for _, k := range liveKeys(path, id) {
		for o := range c.live[k] {
			if o.resource == resource || o.closed || c.resources[o.resource] == nil || c.resources[o.resource].endpoints[o.path] != o {
				continue
			}
			if o.path == path || sameSocket(o.id, id) {
				return kubeletrules.Wrap("device plugin already connected: "+path,
					&EndpointConflictError{Endpoint: path, Resource: resource, Other: o.resource, OtherPath: o.path})
			}
		}
	}
	return nil
}

// sameEndpointLocked returns the live endpoint of res at path, or else
// the live endpoint of res on another path to the socket id, or nil.
func (c *core) sameEndpointLocked(res *resource, path string, id unixsock.Identity) *entry {
	if e := res.endpoints[path]; e != nil && !e.closed {
		return e
	}
	if id == (unixsock.Identity{}) {
		return nil
	}
	for o := range c.live[socketIndexKey(id)] {
		if o.resource == res.name && !o.closed && res.endpoints[o.path] == o {
			return o
		}
	}
	return nil
}

// liveKeys are the keys of the index of live endpoints for an endpoint at
// path whose socket is id.
func liveKeys(path string, id unixsock.Identity) []string {
	if id == (unixsock.Identity{}) {
		return []string{path}
	}
	return []string{path, socketIndexKey(id)}
}

// socketIndexKey is the key of the index of live endpoints for the socket
// id: never an absolute path, so it cannot meet one.
func socketIndexKey(id unixsock.Identity) string { return "socket " + id.Generation() }

// sameSocket reports whether a and b, both known, identify one socket
// file: the same inode of the same device, created at the same time.
func sameSocket(a, b unixsock.Identity) bool {
	return a != (unixsock.Identity{}) && a.Generation() == b.Generation()
}

// indexLocked adds e, being installed, to the index of live endpoints.
func (c *core) indexLocked(e *entry) {
	for _, key := range liveKeys(e.path, e.id) {
		if key == "" {
			continue
		}
		set := c.live[key]
		if set == nil {
			set = map[*entry]struct{}{}
			c.live[key] = set
		}
		set[e] = struct{}{}
	}
}

// unindexLocked removes e, closed, from the index of live endpoints.
func (c *core) unindexLocked(e *entry) {
	for _, key := range liveKeys(e.path, e.id) {
		if set := c.live[key]; set != nil {
			delete(set, e)
			if len(set) == 0 {
				delete(c.live, key)
			}
		}
	}
}
