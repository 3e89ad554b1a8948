// Command nodeplugctl is the command line for people over nodeplug's three
// gRPC services: it lists plugins, drivers, resources and allocations,
// allocates and releases devices, starts containers with them (the CDI
// devices and a runtime's arguments), follows live changes, applies and
// deletes objects of the node-local Kubernetes API (apply, delete), shows
// its pods and their events (pods, events, describe pod), draws a
// registration's or an allocation's trace (from nodeplug-console or
// Jaeger), and checks a plugin against the kubelet's contract (conform).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"

	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/pkg/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runIO(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// globals are the flags every command takes, before or after the command.
// Each also reads NODEPLUG_CTL_<FLAG>, except --root-dir, which reads
// NODEPLUG_ROOT_DIR as the services do (a flag on the command line wins).
type globals struct {
	rootDir           string
	watcherAddr       string
	reconcilerAddr    string
	devicemanagerAddr string
	dramanagerAddr    string
	jaegerURL         string
	timeout           time.Duration
	tls               app.TLS
	// output is -o given before the command: the default of the command's
	// own -o.
	output string
}

var globalDefaults = globals{
	rootDir:   layout.DefaultRootDir,
	jaegerURL: app.DefaultJaegerURL,
	timeout:   10 * time.Second,
}

// define defines the global flags on fs, storing into g, with def as their
// defaults.
func (g *globals) define(fs *flag.FlagSet, def globals) {
	app.AbsPathVar(fs, &g.rootDir, "root-dir", def.rootDir, "the services' root dir: their API sockets are <root-dir>/nodeplug/<service>.sock (a relative one is below the working directory)")
	fs.StringVar(&g.watcherAddr, "watcher-addr", def.watcherAddr, "the watcher's API: a socket path, or host:port with the TLS flags (default from --root-dir)")
	fs.StringVar(&g.reconcilerAddr, "reconciler-addr", def.reconcilerAddr, "the reconciler's API (default from --root-dir)")
	fs.StringVar(&g.devicemanagerAddr, "devicemanager-addr", def.devicemanagerAddr, "the devicemanager's API (default from --root-dir)")
	fs.StringVar(&g.dramanagerAddr, "dramanager-addr", def.dramanagerAddr, "the dramanager's API: DRA drivers, slices and claims (default from --root-dir)")
	fs.StringVar(&g.tls.CertFile, "tls-cert-file", def.tls.CertFile, "client certificate for host:port addresses (mutual TLS)")
	fs.StringVar(&g.tls.KeyFile, "tls-key-file", def.tls.KeyFile, "key of --tls-cert-file")
	fs.StringVar(&g.tls.CAFile, "tls-ca-file", def.tls.CAFile, "CA certificate that signs the services' certificates")
	fs.BoolVar(&g.tls.Insecure, "insecure-tcp", def.tls.Insecure, "dial host:port without TLS (tests only, loopback only)")
	fs.StringVar(&g.jaegerURL, "jaeger-url", def.jaegerURL, "Jaeger query base URL (trace reads nodeplug-console instead when it runs under --root-dir and this is not set)")
	fs.DurationVar(&g.timeout, "timeout", def.timeout, "timeout of each call")
}

// cli runs one command. Its fields are what tests replace.
type cli struct {
	g      globals
	stdin  io.Reader // what -f - reads
	stdout io.Writer
	stderr io.Writer
	http   *http.Client
	conns  map[string]*grpc.ClientConn
	// help, when set, gets a command's flag set on -h in place of its
	// usage message (the command reference reads the flags from it).
	help func(fs *flag.FlagSet)
}

type command struct {
	name    string
	args    string // usage of the arguments after the flags
	summary string
	run     func(ctx context.Context, c *cli, args []string) error
}

var commands []command

const allocateArgs = "--pod UID --container NAME [--namespace NS --name NAME] [--must-include [RESOURCE=]ID]... [-o table|json] RESOURCE=COUNT..."

func init() {
	commands = []command{
		{"plugins", "[-o table|json]", "every plugin: the reconciler's plugins_registry sockets and the device plugins registered on kubelet.sock", cmdPlugins},
		{"drivers", "[-o table|json]", "registered CSI and DRA drivers, and each DRA driver instance's connection in the dramanager", cmdDrivers},
		{"slices", "[--driver NAME] [-o table|json]", "this node's DRA ResourceSlices: driver, pool, devices with attributes and capacity", cmdSlices},
		{"claims", "[--namespace NS] [--all] [-o table|json]", "DRA ResourceClaims that concern this node (--all: every one) and this node's view of them: state, devices with health, pods, CDI IDs", cmdClaims},
		{"apply", applyArgs, "create or update the objects of a YAML file (Namespaces, Pods, Events, ResourceClaims and their templates, DeviceClasses, DeviceTaintRules), through the node-local resource API (operator)", cmdApply},
		{"delete", deleteArgs, "delete the objects of a YAML file, or objects by kind and name (pod NS/NAME), through the node-local resource API (operator)", cmdDelete},
		{"pods", podsArgs, "the node-local API's pods (every namespace's, or -n's): phase, containers, claims and their devices, age, latest event", cmdPods},
		{"events", eventsArgs, "the node-local API's events, oldest first (--for NS/NAME: one pod's)", cmdEvents},
		{"logs", logsArgs, "a container's log, as kubectl logs prints it, from the files its runtime writes under <root-dir>/pod-logs", cmdLogs},
		{"describe", describeArgs, "a pod in detail, as kubectl describe pod: node, status, conditions, containers, its claims with their devices, its events", cmdDescribe},
		{"prepare", prepareArgs, "prepare a pod's DRA claims: allocate, NodePrepareResources, the CDI device IDs per container", cmdPrepare},
		{"resources", "[-o table|json]", "device plugin resources: capacity, allocatable, free, endpoints", cmdResources},
		{"allocations", "[--pod UID] [-o table|json]", "what is allocated to whom, with trace IDs", cmdAllocations},
		{"sockets", "[-o table|json]", "the sockets the watcher sees in plugins_registry", cmdSockets},
		{"allocate", allocateArgs, "allocate devices to a container", cmdAllocate},
		{"release", "--pod UID [--container NAME]", "free a pod's (or one container's) devices", cmdRelease},
		{"start", startArgs, "a container starts: PreStartContainer where asked, its CDI devices resolved (-o podman|docker: a runtime's arguments)", cmdStart},
		{"watch", "sockets|plugins|resources [-o text|json] [--no-allocations]", "follow live changes (Ctrl-C stops)", cmdWatch},
		{"trace", "[--source auto|console|jaeger] TRACE_ID", "draw a trace from the console (make run) or Jaeger (make up) as a text waterfall", cmdTrace},
		{"conform", conformArgs, "check a plugin against the kubelet's contract, playing the kubelet", cmdConform},
		{"healthcheck", healthcheckArgs, "exit 0 when a service (gRPC health) or Jaeger (its query API) serves, else 1", cmdHealthcheck},
		{"completion", completionArgs, "print a shell completion script of the commands and flags (source <(nodeplugctl completion bash))", cmdCompletion},
		{"version", "", "print the version", cmdVersion},
	}
}

// tracedCommands are the commands whose calls change something: each
// call starts a trace of its own in the service, as the services trace
// every call that comes without a trace context. The others only read.
var tracedCommands = map[string]bool{"allocate": true, "release": true, "start": true, "prepare": true, "apply": true, "delete": true}

// traceCalls sets how the calls of the command about to run are traced.
// A read's calls carry a trace context that says "not sampled", as the
// console's own reads do: the services' parent-based samplers follow it,
// so listing and watching fill no trace view (nor Jaeger) with traces of
// their own. A write's calls carry none.
func traceCalls(traced bool) {
	if traced {
		otel.SetTracerProvider(tracenoop.NewTracerProvider())
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())
		return
	}
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())))
	otel.SetTextMapPropagator(telemetry.Propagator)
}

// usageError is a mistake on the command line: exit code 2, with usage.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return usageError{fmt.Sprintf(format, a...)} }

// run runs nodeplugctl with no standard input (-f - reads none).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runIO(ctx, args, nil, stdout, stderr)
}

func runIO(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr, http: &http.Client{}, conns: map[string]*grpc.ClientConn{}}
	defer c.close()
	var showVersion bool
	fs := c.globalFlags(&showVersion)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.usage(stdout, fs)
			return exitOK
		}
		fmt.Fprintln(stderr, "nodeplugctl:", err)
		c.usage(stderr, fs)
		return exitUsage
	}
	if showVersion {
		fmt.Fprintf(stdout, "nodeplugctl %s\n", version.Version)
		return exitOK
	}
	rest := fs.Args()
	if len(rest) == 0 {
		c.usage(stderr, fs)
		return exitUsage
	}
	name := rest[0]
	if name == "help" {
		c.usage(stdout, fs)
		return exitOK
	}
	if name == completeCommand {
		return complete(ctx, rest[1:], stdout)
	}
	for _, cmd := range commands {
		if cmd.name != name {
			continue
		}
		if c.g.output != "" && !strings.Contains(cmd.args, "-o ") {
			fmt.Fprintf(stderr, "nodeplugctl %s: -o: %s has no output format\nusage: nodeplugctl %s %s\n", name, name, name, cmd.args)
			return exitUsage
		}
		traceCalls(tracedCommands[name])
		err := cmd.run(ctx, c, rest[1:])
		var ue usageError
		switch {
		case err == nil:
			return exitOK
		case errors.Is(err, flag.ErrHelp):
			return exitOK
		case errors.As(err, &ue):
			fmt.Fprintf(stderr, "nodeplugctl %s: %v\nusage: nodeplugctl %s %s\n", name, err, name, cmd.args)
			return exitUsage
		default:
			fmt.Fprintf(stderr, "nodeplugctl %s: %v\n", name, err)
			return exitError
		}
	}
	fmt.Fprintf(stderr, "nodeplugctl: unknown command %q", name)
	if near := nearestCommand(name); near != "" {
		fmt.Fprintf(stderr, "; did you mean %q?", near)
	}
	fmt.Fprintln(stderr, "\nRun 'nodeplugctl help' for the commands and flags.")
	return exitUsage
}

// globalFlags returns the flag set of the global flags, given before the
// command: they store into c.g, --version into showVersion. Their
// variables are NODEPLUG_CTL_<FLAG> (and NODEPLUG_ROOT_DIR for --root-dir:
// app.Flags.EnvName).
func (c *cli) globalFlags(showVersion *bool) *app.Flags {
	fs := app.NewFlags("ctl")
	fs.SetOutput(io.Discard)
	c.g.define(fs.FlagSet, globalDefaults)
	// -o before the command is the command's -o (it is not one of the
	// flags defined again after the command: each command has its own
	// choices).
	fs.StringVar(&c.g.output, "o", "", "output format of the command (as its own -o)")
	fs.StringVar(&c.g.output, "output", "", "output format of the command (as its own -o)")
	fs.AddVersion(showVersion)
	return fs
}

// nearestCommand returns the command name closest to name: one it begins,
// or one within two edits of it (ties to the first in the list); "" when
// none is that close.
func nearestCommand(name string) string {
	best, bestD := "", 3
	for _, cmd := range commands {
		if len(name) >= 3 && strings.HasPrefix(cmd.name, name) {
			return cmd.name
		}
		if d := editDistance(name, cmd.name); d < bestD {
			best, bestD = cmd.name, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, by bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func (c *cli) usage(w io.Writer, fs *app.Flags) {
	fmt.Fprintln(w, "usage: nodeplugctl [global flags] COMMAND [flags] [args]")
	fmt.Fprintln(w, "\ncommands:")
	for _, cmd := range commands {
		fmt.Fprintf(w, "  %-12s %s\n", cmd.name, cmd.summary)
	}
	fmt.Fprintln(w, "\nglobal flags (also accepted after the command):")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// flags returns a flag set for a command that also takes the global flags.
func (c *cli) flags(name, args string) *flag.FlagSet {
	fs := flag.NewFlagSet("nodeplugctl "+name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	fs.Usage = func() {
		if c.help != nil {
			c.help(fs)
			return
		}
		fmt.Fprintf(fs.Output(), "usage: nodeplugctl %s %s\n", name, args)
		fs.PrintDefaults()
	}
	// Values parsed before the command are the defaults here.
	c.g.define(fs, c.g)
	return fs
}

// parseInterspersed parses flags that may come before, between or after the
// positional arguments, and returns the positional ones. "--" ends flags.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageError{err.Error()}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func cmdVersion(_ context.Context, c *cli, args []string) error {
	fs := c.flags("version", "")
	if _, err := parseInterspersed(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "nodeplugctl %s\n", version.Version)
	return nil
}
