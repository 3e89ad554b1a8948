package reconciler

import (
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// State is where a socket's registration stands.
type State int

// States of a socket.
const (
	// StatePending: known, not registered yet, or an operation is running.
	StatePending State = iota + 1
	// StateRegistered: registered with its handler and told so.
	StateRegistered
	// StateFailed: the last attempt failed; NextRetry says when the next is
	// due.
	StateFailed
)

func (s State) String() string {
	switch s {
	case StatePending:
		return "pending"
	case StateRegistered:
		return "registered"
	case StateFailed:
		return "failed"
	}
	return "unknown"
}

// PluginStatus is what the reconciler knows about one socket.
type PluginStatus struct {
	SocketPath     string
	State          State
	Name           string
	Type           string
	Endpoint       string
	Versions       []string
	Generation     string
	LastError      string
	NextRetry      time.Time
	LastTraceID    string
	LastTransition time.Time
	Failures       int

	// firstSpan is the span of the first failed attempt for this
	// generation; retries link to it.
	firstSpan trace.SpanContext
}

func (s PluginStatus) clone() PluginStatus {
	s.Versions = slices.Clone(s.Versions)
	return s
}

// Change is one entry of the WatchPlugins stream.
type Change struct {
	Removed  bool
	Plugin   PluginStatus
	Revision uint64
}
