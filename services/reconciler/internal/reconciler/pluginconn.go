package reconciler

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/executor"
)

// The plugin's side of a registration: its registration socket dialled
// across the bind→listen gap, GetInfo (step 1 of register) and
// NotifyRegistrationStatus (step 6, and the refusal's notification).

// connectParams make gRPC's own reconnection quick; the refused
// connections of the bind→listen gap are retried by dialListening.
var connectParams = grpc.ConnectParams{
	Backoff: backoff.Config{
		BaseDelay:  2 * time.Millisecond,
		Multiplier: 2,
		Jitter:     0.2,
		MaxDelay:   50 * time.Millisecond,
	},
	MinConnectTimeout: time.Second,
}

// pluginConn is the connection to a plugin's registration socket for one
// attempt.
type pluginConn struct {
	path   string
	conn   *grpc.ClientConn
	client registerapi.RegistrationClient
}

func (c *pluginConn) close() { _ = c.conn.Close() }

// getInfo (step 1) dials the plugin (connect) and calls GetInfo within the
// GetInfo budget (Options.GetInfoTimeout on the reconciler's clock). The
// plugin's endpoint defaults to its socket.
func (r *Reconciler) getInfo(ctx context.Context, d cache.Socket, a executor.Attempt) (cache.Plugin, *pluginConn, error) {
	var info *registerapi.PluginInfo
	var c *pluginConn
	err := step(ctx, "reconciler.GetInfo", func(ctx context.Context) (err error) {
		if c, err = r.connect(ctx, d.Path, a); err != nil {
			return err
		}
		// The budget runs on the reconciler's clock, as its backoff does.
		gctx, cancel := r.clock.WithTimeout(ctx, r.opts.GetInfoTimeout)
		defer cancel()
		// WaitForReady: the plugin listens (it accepted in connect), so a
		// handshake slowed by a busy machine, or a transport that had to
		// reconnect, is waited for within the budget rather than failed.
		info, err = c.client.GetInfo(gctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
		if err != nil {
			c.close()
			if errors.Is(context.Cause(gctx), context.DeadlineExceeded) && ctx.Err() == nil {
				err = fmt.Errorf("no answer within %s: %w", r.opts.GetInfoTimeout, errdefs.ErrDeadlineExceeded)
			} else {
				err = errdefs.FromGRPC(err)
			}
			return fmt.Errorf("RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket %s, err: %w", d.Path, err)
		}
		return nil
	})
	if err != nil {
		return cache.Plugin{}, nil, err
	}
	p := cache.Plugin{
		SocketPath: d.Path,
		Generation: d.Generation,
		Type:       info.GetType(),
		Name:       info.GetName(),
		Endpoint:   info.GetEndpoint(),
		Versions:   info.GetSupportedVersions(),
	}
	if p.Endpoint == "" {
		p.Endpoint = d.Path
	}
	return p, c, nil
}

// connect dials the plugin's registration socket at path. A refused
// connection is redialled within milliseconds for Options.RefusedWindow
// (dialListening), so a socket reported at bind() before listen() is not a
// failure, and a stale one fails fast; a retry, which comes a backoff
// later, connects once. That first connect holds no worker
// (Attempt.Waiting): the stale sockets being retried never keep a healthy
// plugin's registration waiting for one (DESIGN "Stale sockets").
func (r *Reconciler) connect(ctx context.Context, path string, a executor.Attempt) (*pluginConn, error) {
	// Only a first attempt can meet the bind→listen gap: a retry comes at
	// least a backoff later, so one refused connect fails it.
	window := r.opts.RefusedWindow
	if a.Failures > 0 {
		window = 0
	}
	dial := dialListening(r.opts.Confiner, path, window)
	// Connect once first, without a worker: a socket that only refuses
	// (stale) fails here, within the refused window. The connection made
	// is the one gRPC uses first.
	var first net.Conn
	err := a.Waiting(ctx, func(ctx context.Context) (err error) {
		first, err = dial(ctx, path)
		return err
	})
	if err != nil {
		if first != nil {
			_ = first.Close()
		}
		return nil, fmt.Errorf("RegisterPlugin error -- dial failed at socket %s, err: %w", path, errdefs.FromGRPC(err))
	}
	conn, err := rpcutil.DialPlugin(path, grpc.WithConnectParams(connectParams), grpc.WithContextDialer(handOver(first, dial)))
	if err != nil {
		_ = first.Close()
		return nil, fmt.Errorf("RegisterPlugin error -- dial failed at socket %s, err: %w", path, err)
	}
	return &pluginConn{path: path, conn: conn, client: registerapi.NewRegistrationClient(conn)}, nil
}

// notify sends NotifyRegistrationStatus: registered when refusal is nil,
// else not registered with told as the reason. It returns refusal, the
// RPC's failure, or both.
func (r *Reconciler) notify(ctx context.Context, conn *pluginConn, told string, refusal error) error {
	return step(ctx, "reconciler.NotifyRegistrationStatus", func(ctx context.Context) error {
		registered := refusal == nil
		trace.SpanFromContext(ctx).SetAttributes(attribute.Bool("nodeplug.registered", registered))
		req := &registerapi.RegistrationStatus{PluginRegistered: registered}
		if !registered {
			// A proto string: the reason may echo a socket path that is not UTF-8.
			req.Error = bounds.Text(told)
		}
		nctx, cancel := context.WithTimeout(ctx, r.opts.NotifyTimeout)
		defer cancel()
		_, err := conn.client.NotifyRegistrationStatus(nctx, req)
		switch {
		case err != nil && !registered:
			return fmt.Errorf("%w; and telling the plugin failed: %w", refusal, errdefs.FromGRPC(err))
		case err != nil:
			return fmt.Errorf("failed to send registration status at socket %s: %w", conn.path, errdefs.FromGRPC(err))
		}
		return refusal
	})
}
