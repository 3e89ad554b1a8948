// Command nodeplug-console serves a web console for nodeplug on loopback
// (127.0.0.1:8080): the plugins, the resources' devices, the allocations,
// the DRA drivers, slices and claims, the pods of the node-local API with
// their claims, devices and events, and each registration's or
// allocation's trace, updating live from the services' Watch streams (and
// the node-local API's watches); the traces can be filtered by service,
// operation, duration and status, and found by a trace ID's prefix or by
// what their spans name (a plugin, a resource, a socket, a pod, a claim).
// It is a reader of the services' APIs and of the node-local API (with
// the reader's kubeconfig) and changes nothing. Traces come from its own bounded OTLP/gRPC receiver (which make
// run points the services at) and from Jaeger's query API (--jaeger-url,
// in compose).
//
// Access needs the random token it prints with its URL at start (a cookie
// after the first visit); the Host header is checked against DNS
// rebinding. The URL and the token are also left, mode 0600, in
// <root-dir>/nodeplug/console.json, where nodeplugctl trace finds them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	healthcheck := len(args) > 0 && args[0] == "healthcheck"
	if healthcheck {
		args = args[1:]
	}
	cfg, fs := newFlags()
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "nodeplug-console:", err)
		return 2
	}
	if cfg.ShowVersion {
		fmt.Fprintf(stdout, "nodeplug-console %s\n", version.Version)
		return 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "nodeplug-console: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if healthcheck {
		return checkListening(cfg.Listen, stderr)
	}
	log, err := cfg.Logger(stderr)
	if err != nil {
		fmt.Fprintln(stderr, "nodeplug-console:", err)
		return 2
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(stderr, "nodeplug-console:", err)
		return 2
	}
	if err := serve(ctx, cfg, log, stdout); err != nil {
		log.Error("exiting", "error", err)
		return 1
	}
	return 0
}

// checkListening is the healthcheck of compose: the page's port accepts
// connections.
func checkListening(listen string, stderr io.Writer) int {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		fmt.Fprintln(stderr, "nodeplug-console healthcheck:", err)
		return 1
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort(host, port), 2*time.Second)
	if err != nil {
		fmt.Fprintln(stderr, "nodeplug-console healthcheck:", err)
		return 1
	}
	_ = c.Close()
	return 0
}

// config is what the console is configured with.
type config struct {
	*app.Common
	TLS          *app.TLS
	Listen       string
	OTLPListen   string
	JaegerURL    string
	TraceLimit   int
	TraceBytes   int
	InfoFile     string
	AllowedHosts *[]string
	Watcher      string
	Reconciler   string
	DM           string
	DRA          string
	Kubeconfig   string
}

func newFlags() (*config, *app.Flags) {
	c := &config{}
	fs := app.NewFlags("console")
	c.Common = fs.AddCommon()
	c.TLS = fs.AddClientTLS()
	fs.StringVar(&c.Listen, "listen", app.DefaultConsoleAddr, "address of the web page (keep it on loopback)")
	fs.StringVar(&c.OTLPListen, "otlp-listen", app.DefaultConsoleOTLPAddr, "loopback address of the OTLP/gRPC trace receiver; empty turns it off")
	fs.StringVar(&c.JaegerURL, "jaeger-url", "", "Jaeger query API to read traces from as well (e.g. http://jaeger:16686); empty: none")
	fs.IntVar(&c.TraceLimit, "trace-limit", 1000, "the receiver keeps at most this many traces (the oldest go first)")
	fs.IntVar(&c.TraceBytes, "trace-bytes", 64<<20, "the receiver keeps at most this many bytes of spans (the oldest traces go first)")
	fs.StringVar(&c.InfoFile, "info-file", "", "file to leave the URL and token in, mode 0600 (default <root-dir>/nodeplug/console.json); - for none")
	c.AllowedHosts = fs.StringList("allowed-host", "a further host name the Host header may carry (besides loopback names and addresses); repeatable")
	fs.StringVar(&c.Watcher, "watcher-addr", "", "the watcher's API: a socket path, or host:port with the TLS flags (default from --root-dir)")
	fs.StringVar(&c.Reconciler, "reconciler-addr", "", "the reconciler's API (default from --root-dir)")
	fs.StringVar(&c.DM, "devicemanager-addr", "", "the devicemanager's API (default from --root-dir)")
	fs.StringVar(&c.DRA, "dramanager-addr", "", "the dramanager's API: DRA drivers, slices and claims (default from --root-dir)")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "the node-local API's kubeconfig, for the pods and their events (default <root-dir>/nodeplug/kubeconfig-reader); - for none")
	return c, fs
}

func (c *config) validate() error {
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("--listen %q: %v", c.Listen, err)
	}
	if c.OTLPListen != "" {
		host, _, err := net.SplitHostPort(c.OTLPListen)
		if err != nil {
			return fmt.Errorf("--otlp-listen %q: %v", c.OTLPListen, err)
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return fmt.Errorf("--otlp-listen %q: the receiver takes spans from anyone who can reach it, so it listens on loopback only", c.OTLPListen)
		}
	}
	if c.TraceLimit < 1 || c.TraceBytes < 1<<10 {
		return fmt.Errorf("--trace-limit must be at least 1 and --trace-bytes at least 1024")
	}
	root, err := filepath.Abs(c.RootDir)
	if err != nil {
		return fmt.Errorf("--root-dir %q: %v", c.RootDir, err)
	}
	c.RootDir = root
	if c.InfoFile == "" {
		c.InfoFile = layout.ConsoleInfoFile(c.RootDir)
	}
	switch c.Kubeconfig {
	case "":
		c.Kubeconfig = layout.IdentityKubeconfigFile(c.RootDir, "reader")
	case "-":
		c.Kubeconfig = ""
	}
	for name, p := range map[string]*string{"watcher": &c.Watcher, "reconciler": &c.Reconciler, "devicemanager": &c.DM, "dramanager": &c.DRA} {
		if *p == "" {
			*p = layout.APISocket(c.RootDir, name)
		}
	}
	return nil
}
