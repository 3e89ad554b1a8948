// Package watchclient feeds the reconciler's desired state from the
// watcher's WatchSocketEvents stream: each new stream's snapshot replaces the
// desired state, live events update it. It resubscribes with backoff when a
// stream ends; meanwhile the desired state stays as it was, so a watcher
// restart changes nothing that did not change on disk.
package watchclient

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	watcherv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/watcher/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
)

// Sink receives the socket set. The reconciler implements it.
type Sink interface {
	// ReplaceSockets makes the desired state exactly sockets.
	ReplaceSockets(sockets []cache.Socket)
	SocketCreated(s cache.Socket)
	SocketDeleted(path, generation string, traceContext map[string]string)
}

// Backoff bounds between resubscriptions. The watcher is a local process
// on a Unix socket: a look every quarter second while it is down costs
// nothing, and a restarted watcher is followed again within that.
const (
	MinBackoff = 20 * time.Millisecond
	MaxBackoff = 250 * time.Millisecond
)

// Client follows the watcher.
type Client struct {
	watcher watcherv1.WatcherServiceClient
	sink    Sink
	log     *slog.Logger
}

// New returns a client feeding sink from watcher.
func New(watcher watcherv1.WatcherServiceClient, sink Sink, log *slog.Logger) *Client {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Client{watcher: watcher, sink: sink, log: log}
}

// Run follows the watcher until ctx ends.
func (c *Client) Run(ctx context.Context) error {
	stream.Resubscribe(ctx, MinBackoff, MaxBackoff, c.follow, func(err error, delay time.Duration) {
		c.log.Warn("watcher stream ended; resubscribing", "error", err, "in", delay)
	})
	return nil
}

// toSocket converts an event. The path is the real one: path_bytes when
// set (a file name that is not UTF-8), else path unquoted when quoted
// (bounds.PathFromWire). An event whose path does not decode is refused
// alone, with the error.
func toSocket(ev *watcherv1.SocketEvent, live bool) (cache.Socket, error) {
	path, err := bounds.PathFromWire(ev.GetPath(), ev.GetPathBytes())
	if err != nil {
		return cache.Socket{}, fmt.Errorf("watcher event (revision %d): %w", ev.GetRevision(), err)
	}
	s := cache.Socket{Path: path, Generation: ev.GetGeneration()}
	if t := ev.GetObservedTime(); t != nil {
		s.Observed = t.AsTime()
	}
	if live {
		s.TraceContext = ev.GetTraceContext()
	}
	return s, nil
}

// follow reads one stream; synced reports whether it got past the snapshot.
func (c *Client) follow(ctx context.Context) (synced bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.watcher.WatchSocketEvents(ctx, &watcherv1.WatchSocketEventsRequest{})
	if err != nil {
		return false, fmt.Errorf("WatchSocketEvents: %w", err)
	}
	var snapshot []cache.Socket
	instance := ""
	for {
		m, err := st.Recv()
		if err != nil {
			return synced, err
		}
		if instance == "" {
			instance = m.GetInstanceId()
		}
		switch item := m.GetItem().(type) {
		case *watcherv1.WatchSocketEventsResponse_Synced:
			if !synced {
				synced = true
				c.sink.ReplaceSockets(snapshot)
				c.log.Info("watcher stream synced", "watcher_instance", instance, "sockets", len(snapshot), "revision", item.Synced.GetRevision())
				snapshot = nil
			}
		case *watcherv1.WatchSocketEventsResponse_Event:
			ev := item.Event
			s, err := toSocket(ev, synced)
			if err != nil {
				c.log.Error("ignoring a watcher event whose path does not decode", "watcher_instance", instance, "error", err)
				continue
			}
			if !synced {
				snapshot = snapshotEvent(snapshot, ev.GetType(), s)
				continue
			}
			switch ev.GetType() {
			case watcherv1.SocketEventType_SOCKET_EVENT_TYPE_CREATED:
				c.sink.SocketCreated(s)
			case watcherv1.SocketEventType_SOCKET_EVENT_TYPE_DELETED:
				c.sink.SocketDeleted(s.Path, s.Generation, ev.GetTraceContext())
			}
		}
	}
}

// snapshotEvent applies one snapshot event to the snapshot read so far.
func snapshotEvent(snapshot []cache.Socket, typ watcherv1.SocketEventType, s cache.Socket) []cache.Socket {
	switch typ {
	case watcherv1.SocketEventType_SOCKET_EVENT_TYPE_CREATED:
		return append(snapshot, s)
	case watcherv1.SocketEventType_SOCKET_EVENT_TYPE_DELETED:
		// Not expected in a snapshot; honour it anyway.
		kept := snapshot[:0]
		for _, k := range snapshot {
			if k.Path != s.Path {
				kept = append(kept, k)
			}
		}
		return kept
	}
	return snapshot
}
