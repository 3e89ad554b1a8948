package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/state"
	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/traces"
	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/web"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
)

// Info is what the console leaves in its info file for nodeplugctl trace
// (and scripts): where it serves and with which token.
type Info struct {
	URL   string `json:"url"`   // base URL of the page, without the token
	Token string `json:"token"` // the access token
	OTLP  string `json:"otlp"`  // the OTLP/gRPC receiver's address, "" when off
	PID   int    `json:"pid"`
}

// serve wires the console together and runs it until ctx ends.
func serve(ctx context.Context, cfg *config, log *slog.Logger, stdout io.Writer) error {
	var conns state.Conns
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			_ = c.Close()
		}
	}()
	for _, d := range []struct {
		addr string
		dst  *grpc.ClientConnInterface
	}{{cfg.Watcher, &conns.Watcher}, {cfg.Reconciler, &conns.Reconciler}, {cfg.DM, &conns.DeviceManager}, {cfg.DRA, &conns.DRAManager}} {
		cc, err := cfg.TLS.Dial(d.addr)
		if err != nil {
			return fmt.Errorf("address %q: %w", d.addr, err)
		}
		closers = append(closers, cc)
		*d.dst = cc
	}
	conns.Kubeconfig = cfg.Kubeconfig
	st := state.New(conns, log)
	// The console's own reads are not traced: its calls carry a trace
	// context that says "not sampled", which the services' parent-based
	// samplers follow, so the reader's polling and streams do not fill the
	// trace views (and Jaeger) with traces of their own.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(telemetry.Propagator)
	defer func() { _ = tp.Shutdown(context.Background()) }()

	var src traces.Sources
	var otlpLis net.Listener
	if cfg.OTLPListen != "" {
		src.Local = traces.NewStore(traces.Limits{MaxTraces: cfg.TraceLimit, MaxBytes: cfg.TraceBytes})
		lis, err := net.Listen("tcp", cfg.OTLPListen)
		if err != nil {
			return fmt.Errorf("OTLP receiver on %s: %w (another receiver or Jaeger there? --otlp-listen changes it)", cfg.OTLPListen, err)
		}
		otlpLis = lis
	}
	if cfg.JaegerURL != "" {
		j, err := traces.NewJaeger(cfg.JaegerURL)
		if err != nil {
			return err
		}
		src.Jaeger = j
	}

	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		if otlpLis != nil {
			_ = otlpLis.Close()
		}
		return fmt.Errorf("listen on %s: %w (--listen changes it)", cfg.Listen, err)
	}
	listenHost, _, _ := net.SplitHostPort(cfg.Listen)
	token := web.NewToken()
	srv := web.New(st, src, web.NewGuard(token, listenHost, *cfg.AllowedHosts), log)
	srv.RootDir = cfg.RootDir
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}

	info := Info{URL: baseURL(lis.Addr().(*net.TCPAddr)), Token: token, PID: os.Getpid()}
	g, gctx := errgroup.WithContext(ctx)
	if otlpLis != nil {
		info.OTLP = otlpLis.Addr().String()
		gs := grpc.NewServer(grpc.MaxRecvMsgSize(16 << 20))
		traces.NewReceiver(src.Local).Register(gs)
		g.Go(func() error { return gs.Serve(otlpLis) })
		g.Go(func() error { <-gctx.Done(); rpcutil.StopGracefully(gs, 2*time.Second); return nil })
	}
	g.Go(func() error { return st.Run(gctx) })
	g.Go(func() error {
		if err := hs.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx) // the event streams never end on their own
		return hs.Close()
	})
	if cfg.InfoFile != "-" {
		if err := writeInfo(cfg.InfoFile, info); err != nil {
			log.Warn("cannot leave the URL and token for nodeplugctl trace", "file", cfg.InfoFile, "error", err)
		} else {
			defer os.Remove(cfg.InfoFile)
		}
	}
	log.Info("serving", "url", info.URL, "otlp_receiver", info.OTLP, "jaeger", cfg.JaegerURL, "watcher", cfg.Watcher, "reconciler", cfg.Reconciler, "devicemanager", cfg.DM, "dramanager", cfg.DRA, "kubeconfig", cfg.Kubeconfig)
	fmt.Fprintf(stdout, "nodeplug-console: open %s/?token=%s\n", info.URL, token)
	if info.OTLP != "" {
		fmt.Fprintf(stdout, "nodeplug-console: OTLP/gRPC trace receiver on %s (OTEL_EXPORTER_OTLP_ENDPOINT=http://%s)\n", info.OTLP, info.OTLP)
	}
	err = g.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// baseURL is the page's URL for a listener; an unspecified address is
// reached on loopback.
func baseURL(a *net.TCPAddr) string {
	host := a.IP.String()
	if a.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, fmt.Sprint(a.Port))
}

// writeInfo writes the info file atomically, mode 0600, creating its
// directory (0750, as the services create it) when needed.
func writeInfo(path string, info Info) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	data, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".console-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		_ = tmp.Close()
		return err
	}
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
