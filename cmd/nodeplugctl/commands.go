package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	reconcilerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	watcherv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/watcher/v1"
)

// now is the clock for ages in tables; tests replace it.
var now = time.Now

// outputFlag adds -o/--output to fs with the given choices: the default is
// the global -o given before the command, else the first choice.
func (c *cli) outputFlag(fs *flag.FlagSet, choices ...string) *string {
	o := new(string)
	def := choices[0]
	if c.g.output != "" {
		def = c.g.output
	}
	usage := "output format: " + strings.Join(choices, " or ")
	fs.StringVar(o, "o", def, usage)
	fs.StringVar(o, "output", def, usage)
	return o
}

func checkOutput(o string, choices ...string) error {
	for _, c := range choices {
		if o == c {
			return nil
		}
	}
	return usagef("output format %q: want %s", o, strings.Join(choices, " or "))
}

// noArgs parses a command that takes only flags.
func noArgs(fs *flag.FlagSet, args []string) error {
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected arguments %q", pos)
	}
	return nil
}

// list runs a List-style command: flags, one call, a table or JSON.
func listCommand[R proto.Message](ctx context.Context, c *cli, name string, args []string, svc service,
	call func(ctx context.Context, fs *flag.FlagSet) (R, error), table func(io.Writer, time.Time, R) error, extra func(fs *flag.FlagSet)) error {
	fs := c.flags(name, "[-o table|json]")
	out := c.outputFlag(fs, "table", "json")
	if extra != nil {
		extra(fs)
	}
	if err := noArgs(fs, args); err != nil {
		return err
	}
	if err := checkOutput(*out, "table", "json"); err != nil {
		return err
	}
	cctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := call(cctx, fs)
	if err != nil {
		return c.rpcError(svc, "list "+name, err)
	}
	if *out == "json" {
		return writeJSON(c.stdout, resp)
	}
	return table(c.stdout, now(), resp)
}

// cmdPlugins lists every plugin: the reconciler's (the sockets of
// plugins_registry) and the device plugins that registered on kubelet.sock,
// which only the devicemanager knows (its endpoints of the legacy path).
func cmdPlugins(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("plugins", "[-o table|json]")
	out := c.outputFlag(fs, "table", "json")
	if err := noArgs(fs, args); err != nil {
		return err
	}
	if err := checkOutput(*out, "table", "json"); err != nil {
		return err
	}
	cctx, cancel := c.call(ctx)
	defer cancel()
	cc, err := c.conn(reconcilerSvc)
	if err != nil {
		return err
	}
	resp, err := reconcilerv1.NewReconcilerServiceClient(cc).ListPlugins(cctx, &reconcilerv1.ListPluginsRequest{})
	if err != nil {
		return c.rpcError(reconcilerSvc, "list plugins", err)
	}
	legacy, err := c.kubeletSockPlugins(cctx)
	if err != nil {
		// The reconciler's list is still worth showing.
		fmt.Fprintf(c.stderr, "nodeplugctl plugins: the device plugins registered on kubelet.sock are not listed: %v\n", err)
	}
	if *out == "json" {
		return writePluginsJSON(c.stdout, resp, legacy)
	}
	return renderPlugins(c.stdout, now(), resp, legacy)
}

// kubeletSockPlugin is a device plugin that registered on kubelet.sock: one
// devicemanager endpoint of the legacy path, and its resource.
type kubeletSockPlugin struct {
	resource string
	endpoint *dmv1.Endpoint
}

// kubeletSockPlugins lists the devicemanager's endpoints registered through
// kubelet.sock.
func (c *cli) kubeletSockPlugins(ctx context.Context) ([]kubeletSockPlugin, error) {
	cc, err := c.conn(devicemanagerSvc)
	if err != nil {
		return nil, err
	}
	resp, err := dmv1.NewDeviceManagerServiceClient(cc).ListResources(ctx, &dmv1.ListResourcesRequest{})
	if err != nil {
		return nil, c.rpcError(devicemanagerSvc, "list resources", err)
	}
	var out []kubeletSockPlugin
	for _, r := range resp.GetResources() {
		for _, e := range r.GetEndpoints() {
			if e.GetRegistrationPath() == dmv1.RegistrationPath_REGISTRATION_PATH_KUBELET_SOCK {
				out = append(out, kubeletSockPlugin{resource: r.GetName(), endpoint: e})
			}
		}
	}
	return out, nil
}

func cmdResources(ctx context.Context, c *cli, args []string) error {
	return listCommand(ctx, c, "resources", args, devicemanagerSvc, func(ctx context.Context, _ *flag.FlagSet) (*dmv1.ListResourcesResponse, error) {
		cc, err := c.conn(devicemanagerSvc)
		if err != nil {
			return nil, err
		}
		return dmv1.NewDeviceManagerServiceClient(cc).ListResources(ctx, &dmv1.ListResourcesRequest{})
	}, renderResources, nil)
}

func cmdAllocations(ctx context.Context, c *cli, args []string) error {
	var pod string
	return listCommand(ctx, c, "allocations", args, devicemanagerSvc, func(ctx context.Context, _ *flag.FlagSet) (*dmv1.ListAllocationsResponse, error) {
		cc, err := c.conn(devicemanagerSvc)
		if err != nil {
			return nil, err
		}
		return dmv1.NewDeviceManagerServiceClient(cc).ListAllocations(ctx, &dmv1.ListAllocationsRequest{PodUid: pod})
	}, renderAllocations, func(fs *flag.FlagSet) {
		fs.StringVar(&pod, "pod", "", "only this pod's allocations")
	})
}

func cmdSockets(ctx context.Context, c *cli, args []string) error {
	return listCommand(ctx, c, "sockets", args, watcherSvc, func(ctx context.Context, _ *flag.FlagSet) (*watcherv1.ListSocketsResponse, error) {
		cc, err := c.conn(watcherSvc)
		if err != nil {
			return nil, err
		}
		return watcherv1.NewWatcherServiceClient(cc).ListSockets(ctx, &watcherv1.ListSocketsRequest{})
	}, renderSockets, nil)
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }

// parseResourceRequests turns RESOURCE=COUNT arguments and --must-include
// values ([RESOURCE=]ID; the resource may be left out when only one is
// requested) into resource requests, in argument order.
func parseResourceRequests(args, mustInclude []string) ([]*dmv1.ResourceRequest, error) {
	if len(args) == 0 {
		return nil, usagef("no resources requested: give RESOURCE=COUNT, e.g. example.com/gpu=1")
	}
	var reqs []*dmv1.ResourceRequest
	byName := map[string]*dmv1.ResourceRequest{}
	for _, a := range args {
		name, count, ok := strings.Cut(a, "=")
		if !ok || name == "" || count == "" {
			return nil, usagef("%q is not RESOURCE=COUNT (e.g. example.com/gpu=1)", a)
		}
		n, err := strconv.ParseInt(count, 10, 64)
		if err != nil || n <= 0 {
			return nil, usagef("count in %q must be a positive integer", a)
		}
		if byName[name] != nil {
			return nil, usagef("resource %s requested twice", name)
		}
		r := &dmv1.ResourceRequest{ResourceName: name, Count: n}
		byName[name] = r
		reqs = append(reqs, r)
	}
	for _, m := range mustInclude {
		name, id, ok := strings.Cut(m, "=")
		if !ok {
			if len(reqs) != 1 {
				return nil, usagef("--must-include %q: with several resources, write RESOURCE=ID", m)
			}
			name, id = reqs[0].GetResourceName(), m
		}
		r := byName[name]
		if r == nil {
			return nil, usagef("--must-include %q: resource %s is not requested", m, name)
		}
		if id == "" {
			return nil, usagef("--must-include %q: empty device ID", m)
		}
		r.MustIncludeDeviceIds = append(r.MustIncludeDeviceIds, id)
	}
	return reqs, nil
}

func cmdAllocate(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("allocate", allocateArgs)
	out := c.outputFlag(fs, "table", "json")
	pod, container := containerFlags(fs)
	namespace := fs.String("namespace", "", "the pod's namespace (optional, with --name; the pod's first Allocate fixes it)")
	name := fs.String("name", "", "the pod's name (optional, with --namespace)")
	var must stringList
	fs.Var(&must, "must-include", "device ID the answer must contain, [RESOURCE=]ID (repeatable)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := checkOutput(*out, "table", "json"); err != nil {
		return err
	}
	if *pod == "" || *container == "" {
		return usagef("--pod and --container are required")
	}
	if (*namespace == "") != (*name == "") {
		return usagef("--namespace and --name go together")
	}
	reqs, err := parseResourceRequests(pos, must)
	if err != nil {
		return err
	}
	resp, err := devicemanagerCall(ctx, c, fmt.Sprintf("allocate for pod %s container %s", *pod, *container),
		func(ctx context.Context, cc *grpc.ClientConn) (*dmv1.AllocateResponse, error) {
			return dmv1.NewDeviceManagerServiceClient(cc).Allocate(ctx, &dmv1.AllocateRequest{
				PodUid: *pod, ContainerName: *container, Resources: reqs, PodNamespace: *namespace, PodName: *name,
			})
		})
	if err != nil {
		return err
	}
	if *out == "json" {
		return writeJSON(c.stdout, resp)
	}
	return renderAllocation(c.stdout, resp)
}

func cmdRelease(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("release", "--pod UID [--container NAME]")
	pod := fs.String("pod", "", "pod UID (required)")
	container := fs.String("container", "", "release only this container (default: the whole pod)")
	if err := noArgs(fs, args); err != nil {
		return err
	}
	if *pod == "" {
		return usagef("--pod is required")
	}
	resp, err := devicemanagerCall(ctx, c, "release pod "+*pod, func(ctx context.Context, cc *grpc.ClientConn) (*dmv1.ReleaseResponse, error) {
		return dmv1.NewDeviceManagerServiceClient(cc).Release(ctx, &dmv1.ReleaseRequest{PodUid: *pod, ContainerName: *container})
	})
	if err != nil {
		return err
	}
	what := "pod " + *pod
	if *container != "" {
		what += " container " + *container
	}
	released := fmt.Sprintf("%d device(s)", resp.GetReleasedDevices())
	if n := resp.GetReleasedClaims(); n != 0 {
		// The pod was dropped from these claims; one no other pod uses is
		// unprepared in the background (claims shows it unpreparing).
		released += fmt.Sprintf(" and %d DRA claim(s)", n)
	}
	_, err = fmt.Fprintf(c.stdout, "released %s of %s\n", released, what)
	return err
}

// devicemanagerCall makes one call of the devicemanager within --timeout; a
// failure is said as rpcError says it, op naming what was asked.
func devicemanagerCall[R any](ctx context.Context, c *cli, op string, call func(context.Context, *grpc.ClientConn) (R, error)) (R, error) {
	return serviceCall(ctx, c, devicemanagerSvc, op, call)
}

// serviceCall makes one call of svc within --timeout; a failure is said as
// rpcError says it, op naming what was asked.
func serviceCall[R any](ctx context.Context, c *cli, svc service, op string, call func(context.Context, *grpc.ClientConn) (R, error)) (R, error) {
	var none R
	cc, err := c.conn(svc)
	if err != nil {
		return none, err
	}
	cctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := call(cctx, cc)
	if err != nil {
		return none, c.rpcError(svc, op, err)
	}
	return resp, nil
}

// followStream opens one Watch stream of svc and hands every item to emit
// until the stream or emit fails.
func followStream[M any](ctx context.Context, c *cli, svc service,
	open func(context.Context, *grpc.ClientConn) (grpc.ServerStreamingClient[M], error), emit func(*M) error) error {
	cc, err := c.conn(svc)
	if err != nil {
		return err
	}
	s, err := open(ctx, cc)
	if err != nil {
		return err
	}
	for {
		m, err := s.Recv()
		if err != nil {
			return err
		}
		if err := emit(m); err != nil {
			return err
		}
	}
}

// cmdWatch follows one of the three Watch streams until ctx ends. A
// subscriber dropped for falling behind resubscribes (a new snapshot
// follows).
func cmdWatch(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("watch", "sockets|plugins|resources [-o text|json] [--no-allocations]")
	out := c.outputFlag(fs, "text", "json")
	noAllocs := fs.Bool("no-allocations", false, "resources: leave out the changes in which only allocations moved (one per Allocate and per Release)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := checkOutput(*out, "text", "json"); err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("say what to watch: sockets, plugins or resources")
	}
	if *noAllocs && pos[0] != "resources" {
		return usagef("--no-allocations applies to watch resources only")
	}
	var svc service
	var follow func(ctx context.Context) error
	emit := func(m proto.Message, line func() string) error {
		if *out == "json" {
			return writeJSONLine(c.stdout, m)
		}
		_, err := fmt.Fprintln(c.stdout, line())
		return err
	}
	switch pos[0] {
	case "sockets":
		svc = watcherSvc
		follow = func(ctx context.Context) error {
			return followStream(ctx, c, svc, func(ctx context.Context, cc *grpc.ClientConn) (grpc.ServerStreamingClient[watcherv1.WatchSocketEventsResponse], error) {
				return watcherv1.NewWatcherServiceClient(cc).WatchSocketEvents(ctx, &watcherv1.WatchSocketEventsRequest{})
			}, func(m *watcherv1.WatchSocketEventsResponse) error {
				return emit(m, func() string { return socketEventLine(m) })
			})
		}
	case "plugins":
		svc = reconcilerSvc
		follow = func(ctx context.Context) error {
			synced := false
			return followStream(ctx, c, svc, func(ctx context.Context, cc *grpc.ClientConn) (grpc.ServerStreamingClient[reconcilerv1.WatchPluginsResponse], error) {
				return reconcilerv1.NewReconcilerServiceClient(cc).WatchPlugins(ctx, &reconcilerv1.WatchPluginsRequest{})
			}, func(m *reconcilerv1.WatchPluginsResponse) error {
				// Every stream starts with a snapshot: the items before
				// its synced marker.
				snapshot := !synced
				synced = synced || m.GetSynced() != nil
				return emit(m, func() string { return pluginChangeLine(now(), m, snapshot) })
			})
		}
	case "resources":
		svc = devicemanagerSvc
		follow = func(ctx context.Context) error {
			synced := false
			return followStream(ctx, c, svc, func(ctx context.Context, cc *grpc.ClientConn) (grpc.ServerStreamingClient[dmv1.WatchResourcesResponse], error) {
				return dmv1.NewDeviceManagerServiceClient(cc).WatchResources(ctx, &dmv1.WatchResourcesRequest{OmitAllocationChanges: *noAllocs})
			}, func(m *dmv1.WatchResourcesResponse) error {
				snapshot := !synced
				synced = synced || m.GetSynced() != nil
				return emit(m, func() string { return resourceChangeLine(now(), m, snapshot) })
			})
		}
	default:
		return usagef("cannot watch %q: want sockets, plugins or resources", pos[0])
	}
	for {
		err := follow(ctx)
		if ctx.Err() != nil {
			return nil // Ctrl-C
		}
		if status.Code(err) == codes.ResourceExhausted {
			fmt.Fprintf(c.stderr, "nodeplugctl watch: fell behind the %s's stream; resubscribing\n", svc.name)
			continue
		}
		if err == nil || errors.Is(err, io.EOF) {
			return fmt.Errorf("the %s ended the stream", svc.name)
		}
		if _, ok := status.FromError(err); !ok {
			return err
		}
		return c.rpcError(svc, "watch "+pos[0], err)
	}
}
