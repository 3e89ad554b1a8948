package access

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/nodeplug/nodeplug/pkg/stream"
)

// WatchBounds bound the Watch streams of an API server by caller (DESIGN
// "Bounds"), each Watch RPC on its own (stream.Slots): a caller that is not
// internal — a uid on the API socket, a client certificate over TCP — may
// hold stream.SlotLimits.PerCaller streams of one RPC, and all such callers
// together every slot but the Reserved ones; the internal role (root, the
// service's own uid, a nodeplug:internal certificate: the services
// themselves) may take any slot and is bounded only by the total. A refused
// stream ends at once with an error wrapping stream.ErrPerCallerBound or
// stream.ErrTotalBound (RESOURCE_EXHAUSTED once the server's error
// interceptor mapped it), and is counted in
// nodeplug_watch_streams_refused_total{method,bound}. The slot is given
// back when the handler returns, which it does when the stream ends however
// it ends (the client cancelled, its connection broke, the server stopped).
//
// The Watch RPCs are the server-streaming methods named Watch* outside the
// health service (whose Watch is no stream of nodeplug's). Chain Stream
// after the Guard: a call it lets through without an identity (only the
// plain TCP listener for tests does) counts as internal, as the Guard
// treats it. Safe for concurrent use.
type WatchBounds struct {
	limits  stream.SlotLimits
	refused *prometheus.CounterVec

	mu    sync.Mutex
	slots map[string]*stream.Slots // by full method name
}

// NewWatchBounds returns bounds keeping limits (zero fields take the
// defaults), counting refusals on reg (when reg is not nil).
func NewWatchBounds(limits stream.SlotLimits, reg prometheus.Registerer) *WatchBounds {
	w := &WatchBounds{
		limits: limits.WithDefaults(),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeplug_watch_streams_refused_total",
			Help: "Watch streams refused at a bound, by method and bound: per_caller (one caller's streams) or total (every stream, or every slot not kept for the services).",
		}, []string{"method", "bound"}),
		slots: map[string]*stream.Slots{},
	}
	if reg != nil {
		reg.MustRegister(w.refused)
	}
	return w
}

// IsWatch reports whether a stream method is one the bounds count.
func IsWatch(info *grpc.StreamServerInfo) bool {
	svc, method, _ := strings.Cut(strings.TrimPrefix(info.FullMethod, "/"), "/")
	return info.IsServerStream && strings.HasPrefix(method, "Watch") && svc != "grpc.health.v1.Health"
}

// Slots returns the slots of one Watch RPC (made on first use).
func (w *WatchBounds) Slots(fullMethod string) *stream.Slots {
	w.mu.Lock()
	defer w.mu.Unlock()
	s, ok := w.slots[fullMethod]
	if !ok {
		s = stream.NewSlots(w.limits)
		w.slots[fullMethod] = s
	}
	return s
}

// callerKey returns who the per-caller bound counts for the call in ctx,
// and whether it may take the slots kept for the services.
func callerKey(ctx context.Context) (key string, privileged bool) {
	c, ok := CallerFrom(ctx)
	if !ok {
		return "an unidentified caller", true
	}
	return c.String(), c.Role >= RoleInternal
}

// Stream is the stream server interceptor of the bounds.
func (w *WatchBounds) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if !IsWatch(info) {
		return handler(srv, ss)
	}
	key, privileged := callerKey(ss.Context())
	release, err := w.Slots(info.FullMethod).Take(key, privileged)
	if err != nil {
		// The method is a registered one (unknown methods never reach
		// interceptors) and the bound one of two: the labels are bounded.
		bound := "total"
		if errors.Is(err, stream.ErrPerCallerBound) {
			bound = "per_caller"
		}
		w.refused.WithLabelValues(info.FullMethod, bound).Inc()
		return fmt.Errorf("%s: %w", info.FullMethod, err)
	}
	defer release()
	return handler(srv, ss)
}
