package app

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// The service manager's side of a service's life, under systemd (a unit of
// Type=notify, with WatchdogSec): sd_notify(3) through the datagram socket
// systemd names in NOTIFY_SOCKET, and the watchdog of WATCHDOG_USEC
// (sd_watchdog_enabled(3)). Without NOTIFY_SOCKET (compose, make run, a
// shell) each message is a no-op, and without WATCHDOG_USEC there is no
// watchdog.

// supervisor tells the service manager where the service is.
type supervisor struct {
	log *slog.Logger

	mu                  sync.Mutex
	readySent, stopSent bool
}

func newSupervisor(log *slog.Logger) *supervisor {
	return &supervisor{log: log}
}

func (s *supervisor) send(state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		s.log.Warn("telling the service manager failed", "message", state, "error", err)
	}
}

// ready says the service serves: systemd starts the units ordered after
// it, and `systemctl start` returns.
// Once only, and never after stopping: a deferred readiness that comes
// during the shutdown (the health server ignores it too) is not said.
func (s *supervisor) ready(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.readySent || s.stopSent {
		return
	}
	s.readySent = true
	s.send(daemon.SdNotifyReady + "\nSTATUS=serving on " + addr)
}

// stopping says the service is on its way down.
func (s *supervisor) stopping() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopSent = true
	s.send(daemon.SdNotifyStopping + "\nSTATUS=shutting down")
}

// watchdogCheckShare bounds one liveness check: a 1/watchdogCheckShare
// share of the watchdog's interval.
const watchdogCheckShare = 4

// watchdog pets systemd's watchdog every half interval while alive says the
// service is alive, until ctx ends. A check that fails, or does not answer
// within a quarter of the interval, is not a pet: after interval without
// one, systemd kills the service and (Restart=always) starts it again.
func (s *supervisor) watchdog(ctx context.Context, interval time.Duration, alive func(context.Context) error) {
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	failing := false
	for {
		cctx, cancel := context.WithTimeout(ctx, interval/watchdogCheckShare)
		err := alive(cctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if !failing {
				s.log.Error("the service does not answer its own health check: the systemd watchdog is not petted, and will restart the service unless it recovers", "error", err, "watchdog", interval.String())
			}
			failing = true
		default:
			if failing {
				s.log.Info("the service answers its health check again: the systemd watchdog is petted again")
			}
			failing = false
			s.send(daemon.SdNotifyWatchdog)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// answersHealth is a service's liveness for the watchdog: a gRPC health
// check through its own API socket, over one connection kept for the
// service's life, answered. It goes through the listener, the server's
// handler pool and the interceptors every caller goes through; a
// NOT_SERVING answer (a service still starting, or stopping) is an answer.
func answersHealth(addr net.Addr) (check func(context.Context) error, closeConn func(), err error) {
	conn, err := rpcutil.DialPeer(addr.String())
	if err != nil {
		return nil, nil, fmt.Errorf("watchdog connection to %s: %w", addr, err)
	}
	hc := healthpb.NewHealthClient(conn)
	return func(ctx context.Context) error {
		// WaitForReady: a connection that went idle reconnects within
		// the check's budget.
		if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
			return fmt.Errorf("health check at %s: %w", addr, err)
		}
		return nil
	}, func() { _ = conn.Close() }, nil
}

// superviseWatchdog starts the watchdog when systemd asks for one
// (WATCHDOG_USEC, for this process), checking that the API at addr answers.
func (rt *Runtime) superviseWatchdog(addr net.Addr) error {
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		return fmt.Errorf("systemd watchdog settings: %w", err)
	}
	if interval <= 0 {
		return nil
	}
	check, closeConn, err := answersHealth(addr)
	if err != nil {
		return err
	}
	rt.Log.Info("systemd watchdog on: petted while the API answers its health check", "watchdog", interval.String(), "addr", addr.String())
	rt.Go(func(ctx context.Context) error {
		defer closeConn()
		rt.sup.watchdog(ctx, interval, check)
		return nil
	})
	return nil
}
