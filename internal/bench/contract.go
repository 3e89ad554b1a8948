package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	watcherv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/watcher/v1"
	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/memory"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// The contract floor is the least a registrar split as DESIGN splits
// nodeplug can do. It keeps the contracts between the services and nothing
// else, in three processes of this executable (ContractFloorFlag):
//
//   - watcher: fsnotify on the directory; each socket created is a
//     SocketEvent, with its generation from lstat, on a WatchSocketEvents
//     stream;
//   - reconciler: for each event, a fresh connection and GetInfo; for a
//     device plugin, RegisterPlugin on the devicemanager, for a DRA driver
//     RegisterDRADriver; then NotifyRegistrationStatus(true);
//   - devicemanager: RegisterPlugin dials the endpoint, calls
//     GetDevicePluginOptions, opens ListAndWatch and makes the registration
//     durable (an appended record, and an fdatasync shared by every
//     registration that arrives meanwhile) before it answers;
//     RegisterDRADriver makes a connection to the driver's endpoint that
//     starts connecting at once, keeps it and answers.
//
// The reconciler and the devicemanager give the memory of a burst back to
// the OS once the burst is gone, as DESIGN asks of nodeplug, each by the
// rule of nodeplug's service of its role (see contractGiveBack): a
// registrar that kept a burst's pages would get the next burst's memory
// without a page fault, which nodeplug may not.
//
// There are no interceptors, stats handlers, spans, logs, metrics, status
// views, validation, backoff or snapshots. So nodeplug/floor splits into
// contract/floor, what the split and the durable registration cost however
// well they are built, and nodeplug/contract, what nodeplug adds to them.

// ContractFloorFlag is the hidden flag of nodeplug-bench that runs one
// process of the contract floor, or the floor alone (the role "floor"):
// its value is the role, and the command line's other arguments are the
// role's.
const ContractFloorFlag = "contract-floor"

// ContractPprofEnv names the file a contract floor process writes its CPU
// profile to, from its start to its end; the bench sets it with -pprof.
const ContractPprofEnv = "NODEPLUG_BENCH_CONTRACT_PPROF"

// ContractFloor runs one role of the contract floor, or the floor alone,
// until ctx ends. watcher: the directory, its socket. devicemanager: its
// socket, the journal file. reconciler: the watcher's socket, the
// devicemanager's socket; it writes "ready" to stdout once the watcher's
// stream is synced and "registered <path>" once a plugin's Notify is
// answered, and returns at the first registration that fails. floor: the
// directory; it writes the same lines (floorProcess).
func ContractFloor(ctx context.Context, role string, args []string, stdout io.Writer) error {
	if path := os.Getenv(ContractPprofEnv); path != "" {
		// A profile of the whole life of this process, beside the
		// services' (-pprof): what the contracts alone cost, to compare.
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	want, ok := roleArgs[role]
	if !ok {
		return fmt.Errorf("contract floor: unknown role %q", role)
	}
	if len(args) != want {
		return fmt.Errorf("contract floor %s: want %d arguments, got %d", role, want, len(args))
	}
	switch role {
	case "watcher":
		return serveUntil(ctx, args[1], func(s *grpc.Server) {
			watcherv1.RegisterWatcherServiceServer(s, &contractWatcher{dir: args[0]})
		})
	case "devicemanager":
		dm, err := newContractDeviceManager(args[1])
		if err != nil {
			return err
		}
		defer dm.close()
		return serveUntil(ctx, args[0], func(s *grpc.Server) {
			dmv1.RegisterDeviceManagerServiceServer(s, dm)
			dmv1.RegisterDRAServiceServer(s, contractDRA{d: dm})
		})
	case "reconciler":
		// nodeplug's reconciler's rule: once the heap's allocations settle.
		go app.SettleLoop(ctx, app.Settle{}, nil, nil)
		return contractReconcile(ctx, args[0], args[1], stdout)
	default: // "floor"
		return floorProcess(ctx, args[0], stdout)
	}
}

// roleArgs is how many arguments each role of ContractFloor takes.
var roleArgs = map[string]int{"watcher": 2, "devicemanager": 2, "reconciler": 2, "floor": 1}

func serveUntil(ctx context.Context, socket string, register func(*grpc.Server)) error {
	l, err := unixsock.Listen(socket)
	if err != nil {
		return err
	}
	s := grpc.NewServer()
	register(s)
	go func() {
		<-ctx.Done()
		s.Stop()
	}()
	// A stop that comes before Serve starts makes it return
	// ErrServerStopped: the same end as a stop after.
	if err := s.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// contractWatcher streams the sockets created in dir, and their removal.
type contractWatcher struct {
	watcherv1.UnimplementedWatcherServiceServer
	dir string
}

func (w *contractWatcher) WatchSocketEvents(_ *watcherv1.WatchSocketEventsRequest, st grpc.ServerStreamingServer[watcherv1.WatchSocketEventsResponse]) error {
	fsw, err := fsnotify.NewBufferedWatcher(4096)
	if err != nil {
		return err
	}
	defer fsw.Close()
	if err := fsw.Add(w.dir); err != nil {
		return err
	}
	// The directory is empty when a round starts: the snapshot is.
	if err := st.Send(&watcherv1.WatchSocketEventsResponse{Item: &watcherv1.WatchSocketEventsResponse_Synced{Synced: &watcherv1.Synced{}}}); err != nil {
		return err
	}
	gens := map[string]string{}
	var rev uint64
	for {
		var ev fsnotify.Event
		select {
		case <-st.Context().Done():
			return nil
		case err := <-fsw.Errors:
			return err
		case ev = <-fsw.Events:
		}
		e := &watcherv1.SocketEvent{Path: ev.Name}
		switch {
		case ev.Has(fsnotify.Create):
			var s syscall.Stat_t
			if syscall.Lstat(ev.Name, &s) != nil || s.Mode&syscall.S_IFMT != syscall.S_IFSOCK {
				continue
			}
			e.Type = watcherv1.SocketEventType_SOCKET_EVENT_TYPE_CREATED
			e.Generation = strconv.FormatUint(s.Dev, 16) + "-" + strconv.FormatUint(s.Ino, 16)
			gens[ev.Name] = e.Generation
		case ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename):
			g, ok := gens[ev.Name]
			if !ok {
				continue
			}
			delete(gens, ev.Name)
			e.Type, e.Generation = watcherv1.SocketEventType_SOCKET_EVENT_TYPE_DELETED, g
		default:
			continue
		}
		rev++
		e.Revision = rev
		if err := st.Send(&watcherv1.WatchSocketEventsResponse{Item: &watcherv1.WatchSocketEventsResponse_Event{Event: e}}); err != nil {
			return err
		}
	}
}

// contractDeviceManager connects device plugin endpoints and makes each
// registration durable before it answers, with a group commit.
type contractDeviceManager struct {
	dmv1.UnimplementedDeviceManagerServiceServer
	journal *os.File
	give    *contractGiveBack

	mu      sync.Mutex
	conns   map[*grpc.ClientConn]struct{}
	pending []byte
	waiters []chan error
	syncing bool
}

func newContractDeviceManager(journal string) (*contractDeviceManager, error) {
	f, err := os.OpenFile(journal, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	return &contractDeviceManager{journal: f, conns: map[*grpc.ClientConn]struct{}{}, give: newContractGiveBack()}, nil
}

func (d *contractDeviceManager) close() {
	d.give.stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	for c := range d.conns {
		_ = c.Close()
	}
	_ = d.journal.Close()
}

func (d *contractDeviceManager) RegisterPlugin(ctx context.Context, req *dmv1.RegisterPluginRequest) (*dmv1.RegisterPluginResponse, error) {
	conn, err := floorDial(req.GetEndpoint())
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.conns[conn] = struct{}{}
	d.mu.Unlock()
	client := pluginapi.NewDevicePluginClient(conn)
	if _, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true)); err != nil {
		return nil, fmt.Errorf("GetDevicePluginOptions %s: %w", req.GetEndpoint(), err)
	}
	// The stream lives as long as the connection; its updates are read
	// and dropped.
	st, err := client.ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		return nil, fmt.Errorf("ListAndWatch %s: %w", req.GetEndpoint(), err)
	}
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				d.mu.Lock()
				delete(d.conns, conn)
				d.mu.Unlock()
				_ = conn.Close()
				d.give.changed()
				return
			}
		}
	}()
	record := req.GetResourceName() + "\t" + req.GetEndpoint() + "\t" + req.GetGeneration() + "\n"
	if err := d.commit([]byte(record)); err != nil {
		return nil, err
	}
	d.give.changed()
	return &dmv1.RegisterPluginResponse{InstanceId: "contract-floor"}, nil
}

// contractDRA is the contract floor devicemanager's DRAService: it keeps a
// connection to each driver registered, as nodeplug's devicemanager (and
// the kubelet) does, without waiting for it to connect; a driver's
// registration is not made durable (nodeplug's is not either).
type contractDRA struct {
	dmv1.UnimplementedDRAServiceServer
	d *contractDeviceManager
}

func (c contractDRA) RegisterDRADriver(_ context.Context, req *dmv1.RegisterDRADriverRequest) (*dmv1.RegisterDRADriverResponse, error) {
	conn, err := connectDRA(req.GetEndpoint())
	if err != nil {
		return nil, err
	}
	c.d.mu.Lock()
	c.d.conns[conn] = struct{}{}
	c.d.mu.Unlock()
	c.d.give.changed()
	return &dmv1.RegisterDRADriverResponse{InstanceId: "contract-floor"}, nil
}

// contractGiveBack is the contract floor devicemanager's memory give-back,
// by the rule of nodeplug's devicemanager (memory.BurstRule's defaults, as
// manager.GiveBack takes them): once at least 64 endpoints have come or
// gone and a second has passed with no more, a collection and every free
// page returned to the OS (memory.Release), at most once every 10 s.
type contractGiveBack struct {
	release func() (before, after uint64)

	mu     sync.Mutex
	burst  *memory.Burst
	timer  *time.Timer // armed once a burst is pending; nil when none is
	closed bool
}

func newContractGiveBack() *contractGiveBack {
	return &contractGiveBack{release: memory.Release, burst: memory.NewBurst(memory.BurstRule{})}
}

// changed counts an endpoint's arrival or departure, and arms the
// give-back once they make a burst. A registration only records the time:
// the one timer of a burst moves itself on while changes keep coming.
func (g *contractGiveBack) changed() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.burst.Changed(time.Now(), 1) && !g.closed {
		g.armLocked()
	}
}

// armLocked sets the timer for when the pending burst is due.
func (g *contractGiveBack) armLocked() {
	due, _ := g.burst.Due()
	g.timer = time.AfterFunc(time.Until(due), g.give)
}

func (g *contractGiveBack) give() {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return
	}
	if _, ok := g.burst.Take(time.Now()); !ok {
		// Changes came since it was armed: wait for the burst to settle.
		g.armLocked()
		g.mu.Unlock()
		return
	}
	g.timer = nil
	g.mu.Unlock()
	g.release()
}

func (g *contractGiveBack) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	if g.timer != nil {
		g.timer.Stop()
	}
}

// commit appends record to the journal and returns once it is on disk.
// Records that arrive while an fdatasync runs share the next one.
func (d *contractDeviceManager) commit(record []byte) error {
	done := make(chan error, 1)
	d.mu.Lock()
	d.pending = append(d.pending, record...)
	d.waiters = append(d.waiters, done)
	if !d.syncing {
		d.syncing = true
		go d.flush()
	}
	d.mu.Unlock()
	return <-done
}

func (d *contractDeviceManager) flush() {
	for {
		d.mu.Lock()
		batch, waiters := d.pending, d.waiters
		d.pending, d.waiters = nil, nil
		if len(waiters) == 0 {
			d.syncing = false
			d.mu.Unlock()
			return
		}
		d.mu.Unlock()
		_, err := d.journal.Write(batch)
		if err == nil {
			err = syscall.Fdatasync(int(d.journal.Fd()))
		}
		for _, w := range waiters {
			w <- err
		}
	}
}

// contractReconcile registers each socket the watcher reports created.
func contractReconcile(ctx context.Context, watcherSocket, dmSocket string, stdout io.Writer) error {
	wc, err := floorDial(watcherSocket)
	if err != nil {
		return err
	}
	defer wc.Close()
	dc, err := floorDial(dmSocket)
	if err != nil {
		return err
	}
	defer dc.Close()
	dm := contractDM{dmv1.NewDeviceManagerServiceClient(dc), dmv1.NewDRAServiceClient(dc)}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	st, err := watcherv1.NewWatcherServiceClient(wc).WatchSocketEvents(ctx, &watcherv1.WatchSocketEventsRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	var outMu sync.Mutex // stdout's lines stay whole
	for {
		resp, err := st.Recv()
		if err != nil {
			if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
				return cause
			}
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if resp.GetSynced() != nil {
			outMu.Lock()
			_, err := fmt.Fprintln(stdout, "ready")
			outMu.Unlock()
			if err != nil {
				return err
			}
			continue
		}
		ev := resp.GetEvent()
		if ev.GetType() != watcherv1.SocketEventType_SOCKET_EVENT_TYPE_CREATED {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := contractRegister(ctx, dm, ev); err != nil {
				cancel(err)
				return
			}
			outMu.Lock()
			defer outMu.Unlock()
			if _, err := fmt.Fprintln(stdout, "registered", ev.GetPath()); err != nil {
				cancel(err)
			}
		}()
	}
}

// contractDM is the contract floor reconciler's devicemanager: both of
// its registration services.
type contractDM struct {
	dp  dmv1.DeviceManagerServiceClient
	dra dmv1.DRAServiceClient
}

func contractRegister(ctx context.Context, dm contractDM, ev *watcherv1.SocketEvent) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return registerSocket(ctx, ev.GetPath(), pluginHandlers{
		devicePlugin: func(ctx context.Context, info *registerapi.PluginInfo, ep string) error {
			if _, err := dm.dp.RegisterPlugin(ctx, &dmv1.RegisterPluginRequest{
				ResourceName: info.GetName(), Endpoint: ep, Versions: info.GetSupportedVersions(),
				SocketPath: ev.GetPath(), Generation: ev.GetGeneration(),
			}, grpc.WaitForReady(true)); err != nil {
				return fmt.Errorf("RegisterPlugin %s: %w", ev.GetPath(), err)
			}
			return nil
		},
		dra: func(ctx context.Context, info *registerapi.PluginInfo, ep string) error {
			if _, err := dm.dra.RegisterDRADriver(ctx, &dmv1.RegisterDRADriverRequest{
				DriverName: info.GetName(), Endpoint: ep, Services: info.GetSupportedVersions(),
				SocketPath: ev.GetPath(), Generation: ev.GetGeneration(),
			}, grpc.WaitForReady(true)); err != nil {
				return fmt.Errorf("RegisterDRADriver %s: %w", ev.GetPath(), err)
			}
			return nil
		},
	})
}

// contractFloor is the running processes of the contract floor (its three
// roles) or of the floor alone (one).
type contractFloor struct {
	procs  []*exec.Cmd
	roles  []string        // each process's role, as procs
	ended  []chan struct{} // closed when its process has ended
	failed chan struct{}   // closed when the first process ends
	// registered has a line for each registration the reconciler
	// finished: its Notify answered.
	registered chan string
	stopping   chan struct{} // closed by Close: lines are no longer read

	mu      sync.Mutex
	closing bool
	err     error
}

// startContractFloor starts the contract floor on dir, with its sockets
// and journal in work, and returns once it is ready for plugins.
func startContractFloor(ctx context.Context, dir, work, pprofDir string) (*contractFloor, error) {
	ws, ds := filepath.Join(work, "w.sock"), filepath.Join(work, "dm.sock")
	return startFloorProcesses(ctx, "contract floor", pprofDir, []floorProc{
		{role: "watcher", profile: "contract-watcher", args: []string{dir, ws}},
		{role: "devicemanager", profile: "contract-devicemanager", args: []string{ds, filepath.Join(work, "journal")}},
		{role: "reconciler", profile: "contract-reconciler", args: []string{ws, ds}, ready: true},
	})
}

// startFloorAlone starts the floor registrar on dir in a process of its
// own (floorProcess) and returns once it watches dir. Its figures and CPU
// are read as the contract floor's, its one role "floor"; its profile is
// floor-alone.cpu.pprof.
func startFloorAlone(ctx context.Context, dir, pprofDir string) (*contractFloor, error) {
	return startFloorProcesses(ctx, "floor alone", pprofDir, []floorProc{{role: "floor", profile: "floor-alone", args: []string{dir}, ready: true}})
}

// floorProc is one process of startFloorProcesses: its role and the role's
// arguments; profile: its CPU profile's name in the profiles' directory,
// without ".cpu.pprof"; ready: it writes "ready", and starting waits for
// it.
type floorProc struct {
	role, profile string
	args          []string
	ready         bool
}

// startFloorProcesses starts procs, the registrar name, in their order, as
// processes of this executable (ContractFloorFlag), each with its CPU
// profile in pprofDir when set.
func startFloorProcesses(ctx context.Context, name, pprofDir string, procs []floorProc) (*contractFloor, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cf := &contractFloor{failed: make(chan struct{}), registered: make(chan string, 64), stopping: make(chan struct{})}
	var once sync.Once
	start := func(p floorProc) error {
		cmd := exec.Command(self, append([]string{"-" + ContractFloorFlag, p.role}, p.args...)...)
		if pprofDir != "" {
			cmd.Env = append(os.Environ(), ContractPprofEnv+"="+filepath.Join(pprofDir, p.profile+".cpu.pprof"))
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		ended := make(chan struct{})
		cf.procs, cf.roles, cf.ended = append(cf.procs, cmd), append(cf.roles, p.role), append(cf.ended, ended)
		ready := make(chan struct{})
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				switch line := sc.Text(); {
				case line == "ready":
					close(ready)
				case strings.HasPrefix(line, "registered "):
					select {
					case cf.registered <- strings.TrimPrefix(line, "registered "):
					case <-cf.stopping:
					}
				}
			}
			err := cmd.Wait()
			cf.mu.Lock()
			if !cf.closing && cf.err == nil {
				cf.err = fmt.Errorf("%s: its %s ended: %v: %s", name, p.role, err, strings.TrimSpace(stderr.String()))
			}
			cf.mu.Unlock()
			close(ended)
			once.Do(func() { close(cf.failed) })
		}()
		if p.ready {
			select {
			case <-ready:
			case <-cf.failed:
				return cf.failure()
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	for _, p := range procs {
		if err := start(p); err != nil {
			return cf, err
		}
	}
	return cf, nil
}

// cpuByRole returns the CPU seconds each process has used so far, by its
// role; a process whose clock cannot be read is left out.
func (cf *contractFloor) cpuByRole() map[string]float64 {
	out := make(map[string]float64, len(cf.procs))
	for i, p := range cf.procs {
		if v, err := cpuSeconds(p.Process.Pid); err == nil {
			out[cf.roles[i]] = v
		}
	}
	return out
}

// awaitRegistered returns once the reconciler has finished n more
// registrations, so that their plugins may go.
func (cf *contractFloor) awaitRegistered(ctx context.Context, n int) error {
	for range n {
		select {
		case <-cf.registered:
		case <-cf.failed:
			return cf.failure()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (cf *contractFloor) failure() error {
	cf.mu.Lock()
	defer cf.mu.Unlock()
	return cf.err
}

// Close stops the processes and returns why one ended early, if one did.
func (cf *contractFloor) Close() error {
	cf.mu.Lock()
	cf.closing = true
	cf.mu.Unlock()
	close(cf.stopping)
	for i := len(cf.procs) - 1; i >= 0; i-- {
		_ = cf.procs[i].Process.Signal(syscall.SIGTERM)
	}
	for _, ended := range cf.ended {
		<-ended
	}
	return cf.failure()
}

// warmContractFloor starts the contract floor on a directory of its own
// and registers one plugin of each kind through it, unmeasured, so that
// its processes are as warm as nodeplug's services when the rounds start.
// Close it when done.
func (r *runner) warmContractFloor(ctx context.Context) (*warmContract, error) {
	return r.warmProcesses(ctx, "contract floor", "contract", true, func(dir, work string) (*contractFloor, error) {
		return startContractFloor(ctx, dir, work, r.cfg.PprofDir)
	})
}

// warmFloorAlone starts the floor registrar in a process of its own, warm
// as warmContractFloor's. Its rounds are contractRound's.
func (r *runner) warmFloorAlone(ctx context.Context) (*warmContract, error) {
	return r.warmProcesses(ctx, "floor alone", "alone", false, func(dir, _ string) (*contractFloor, error) {
		return startFloorAlone(ctx, dir, r.cfg.PprofDir)
	})
}

// warmProcesses makes the directories of a registrar of this executable's
// processes (its plugin directory, prefix-<seq>, and a work directory for
// its own sockets when it has some), starts it on them and registers one
// plugin of each kind through it, unmeasured.
func (r *runner) warmProcesses(ctx context.Context, name, prefix string, hasWork bool, start func(dir, work string) (*contractFloor, error)) (*warmContract, error) {
	seq := r.seq.Add(1)
	w := &warmContract{dir: filepath.Join(r.root, fmt.Sprintf("%s-%d", prefix, seq))}
	dirs := []string{w.dir}
	if hasWork {
		w.work = filepath.Join(r.root, fmt.Sprintf("cf%d", seq)) // short: the sockets live here
		dirs = append(dirs, w.work)
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, err
		}
	}
	var err error
	if w.cf, err = start(w.dir, w.work); err != nil {
		_ = w.Close()
		return nil, err
	}
	for _, kind := range r.cfg.floorKinds() {
		if _, err := r.contractRound(ctx, w, kind, 1); err != nil {
			_ = w.Close()
			return nil, fmt.Errorf("%s warm-up: %w", name, err)
		}
	}
	return w, nil
}

// warmContract is a running contract floor and its directories.
type warmContract struct {
	cf        *contractFloor
	dir, work string
}

// Close stops the contract floor and removes its directories.
func (w *warmContract) Close() error {
	var err error
	if w.cf != nil {
		err = w.cf.Close()
	}
	_ = os.RemoveAll(w.dir)
	_ = os.RemoveAll(w.work)
	return err
}

// contractRound runs one round against the contract floor, or the floor
// alone. The round fails as soon as one of the floor's processes ends.
func (r *runner) contractRound(ctx context.Context, w *warmContract, kind string, n int) (RoundFigures, error) {
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-w.cf.failed:
			cancel(w.cf.failure())
		case <-rctx.Done():
		}
	}()
	// Once every plugin is told, the round waits for the reconciler's
	// Notify calls to be answered before the plugins go.
	cpu0, cpu1 := w.cf.cpuByRole(), map[string]float64(nil)
	figs, err := r.round(rctx, kind, n, w.dir, nil, func() error {
		err := w.cf.awaitRegistered(rctx, n)
		cpu1 = w.cf.cpuByRole()
		return err
	})
	figs.setCPU(cpu0, cpu1, n)
	if cause := context.Cause(rctx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause
	}
	return figs, err
}
