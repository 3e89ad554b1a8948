package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	watcherv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/watcher/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// watchHogEnv, with accessCallerEnv (which keeps TestMain from building a
// stack), makes the test binary a reader holding Watch streams for
// TestReadersLeaveTheServicesWatchSlots (see TestWatchHog).
const watchHogEnv = "NODEPLUG_E2E_WATCH_HOG"

// hogServices are the services whose Watch the reconciler needs.
var hogServices = []string{"watcher", "devicemanager"}

// The bounds under test are the services' defaults (--watch-streams 64,
// --watch-streams-per-caller 8, --watch-streams-reserved 16): readers
// together hold 48 at most.
const (
	defaultWatchStreams = 64
	defaultPerCaller    = 8
	defaultShared       = 64 - 16
)

// hog is one reader process holding Watch streams, as another uid.
type hog struct {
	uid uint32
	cmd *exec.Cmd

	mu       sync.Mutex
	held     map[string]int      // streams open now, by service, as the process saw them
	maxHeld  map[string]int      // the most it held at once
	refusals map[string][]string // the first refusal of each kind, by service
	exited   chan struct{}
}

// startHog runs a reader as uid (in the API group) that keeps streams
// Watch streams open on each of hogServices, reopening each as soon as it
// ends or is refused.
func startHog(t *testing.T, bin, root string, uid, apiGID uint32, streams int) *hog {
	t.Helper()
	h := &hog{uid: uid, held: map[string]int{}, maxHeld: map[string]int{}, refusals: map[string][]string{}, exited: make(chan struct{})}
	h.cmd = exec.Command(bin, "-test.run=^TestWatchHog$", "-test.v")
	h.cmd.Env = append(os.Environ(), accessCallerEnv+"=1", watchHogEnv+"="+strconv.Itoa(streams), "NODEPLUG_ROOT_DIR="+root)
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{apiGID}}}
	out, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	h.cmd.Stderr = h.cmd.Stdout
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go h.read(out)
	t.Cleanup(h.kill)
	return h
}

// read follows the hog's report lines: HELD <svc> <n> and
// REFUSED <svc> <code> <message>.
func (h *hog) read(out io.Reader) {
	defer close(h.exited)
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.SplitN(strings.TrimSpace(sc.Text()), " ", 4)
		h.mu.Lock()
		switch {
		case len(f) == 3 && f[0] == "HELD":
			n, _ := strconv.Atoi(f[2])
			h.held[f[1]] = n
			h.maxHeld[f[1]] = max(h.maxHeld[f[1]], n)
		case len(f) == 4 && f[0] == "REFUSED":
			h.refusals[f[1]] = append(h.refusals[f[1]], f[2]+" "+f[3])
		}
		h.mu.Unlock()
	}
}

// kill ends the hog with SIGKILL: its connections break without a
// goodbye, as an attacker's killed process leaves them.
func (h *hog) kill() {
	if h.cmd.Process != nil && h.cmd.ProcessState == nil {
		_ = h.cmd.Process.Kill()
		<-h.exited
		_ = h.cmd.Wait()
	}
}

func (h *hog) stats(svc string) (held, maxHeld int, refusals []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held[svc], h.maxHeld[svc], append([]string(nil), h.refusals[svc]...)
}

// TestReadersLeaveTheServicesWatchSlots runs the stack as root (the
// services' own uid) and readers as other uids in the API group, each
// reopening Watch streams on the watcher and the devicemanager the moment
// one ends or is refused — together more streams than the services serve
// (64). One reader holds 8 (its per-caller bound) and is refused beyond;
// the others fill every slot readers may have (48). The reconciler is
// killed and started again: its watches take the slots kept for the
// services, it reports SERVING, and a plugin started then registers. A
// reader is refused with RESOURCE_EXHAUSTED naming the bound, with the
// numbers; no reader ever holds more than its bound, nor all of them more
// than 48. Killed, the readers' slots come back.
func TestReadersLeaveTheServicesWatchSlots(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("running readers as other users needs root")
	}
	const apiGID = 4345
	var groups []string
	for _, svc := range []string{"APISERVER", "WATCHER", "RECONCILER", "DEVICEMANAGER"} {
		groups = append(groups, fmt.Sprintf("NODEPLUG_%s_API_GROUP=%d", svc, apiGID))
	}
	e := newEnv(t, groups...)
	if err := os.Chmod(e.root, 0o755); err != nil { // let the readers reach nodeplug/ (0750, group apiGID)
		t.Fatal(err)
	}
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(binDir, "watch-hog")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	held := func(hogs []*hog, svc string) (sum int) {
		for _, h := range hogs {
			n, _, _ := h.stats(svc)
			sum += n
		}
		return sum
	}

	// The greedy reader first, with twice its bound: it holds its 8 and
	// goes on asking.
	greedy := startHog(t, bin, e.root, 62000, apiGID, 2*defaultPerCaller)
	testutil.Eventually(t, "the greedy reader holds its streams", func() error {
		for _, svc := range hogServices {
			if n := held([]*hog{greedy}, svc); n < defaultPerCaller {
				return fmt.Errorf("%d on the %s", n, svc)
			}
		}
		return nil
	})
	// Six more readers with 8 each: with the greedy one's 16, as many
	// streams as each service serves.
	hogs := []*hog{greedy}
	for i := 1; i <= 6; i++ {
		hogs = append(hogs, startHog(t, bin, e.root, 62000+uint32(i), apiGID, defaultPerCaller))
	}
	testutil.Eventually(t, "the readers hold every slot they may", func() error {
		for _, svc := range hogServices {
			if n := held(hogs, svc); n < defaultShared {
				return fmt.Errorf("%d on the %s", n, svc)
			}
		}
		return nil
	})

	// The reconciler restarts while they go on.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e.st.Kill("reconciler")
	if err := e.st.Start(ctx, "reconciler"); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	e.waitLive()
	t.Logf("the reconciler was SERVING %s after its restart, with the readers holding %d and %d streams",
		time.Since(restarted).Round(time.Millisecond), held(hogs, "watcher"), held(hogs, "devicemanager"))
	p := e.plugin("late", "example.com/late", 2, false)
	e.waitAllocatable("example.com/late", 2)
	testutil.Eventually(t, "the reconciler shows the new plugin registered", func() error {
		if st := e.pluginBySocket(p.SocketPath()).GetState(); st != rcv1.PluginState_PLUGIN_STATE_REGISTERED {
			return fmt.Errorf("state %v", st)
		}
		return nil
	})

	checkBounds(t, hogs)

	// Killed readers give their slots back: the greedy reader's uid,
	// started again alone, holds its 8 at once.
	for _, h := range hogs {
		h.kill()
	}
	again := startHog(t, bin, e.root, 62000, apiGID, defaultPerCaller)
	testutil.Eventually(t, "the greedy reader's uid holds its streams again", func() error {
		for _, svc := range hogServices {
			if n := held([]*hog{again}, svc); n != defaultPerCaller {
				_, _, refusals := again.stats(svc)
				return fmt.Errorf("%d on the %s (refusals %q)", n, svc, refusals)
			}
		}
		return nil
	})
}

// checkBounds checks what the readers saw on each service: none held more
// than its per-caller bound at once, all of them not more than the shared
// slots now, every refusal was RESOURCE_EXHAUSTED, and refusals named the
// per-caller bound and the total bound, with the numbers.
func checkBounds(t *testing.T, hogs []*hog) {
	t.Helper()
	for _, svc := range hogServices {
		now := 0
		var perCaller, total bool
		for _, h := range hogs {
			n, most, refusals := h.stats(svc)
			now += n
			if most > defaultPerCaller {
				t.Errorf("uid %d held %d streams on the %s at once, more than its bound %d", h.uid, most, svc, defaultPerCaller)
			}
			for _, r := range refusals {
				code, msg, _ := strings.Cut(r, " ")
				if code != strconv.Itoa(int(codes.ResourceExhausted)) {
					t.Errorf("uid %d's stream on the %s ended with code %s: %s", h.uid, svc, code, msg)
				}
				perCaller = perCaller || strings.Contains(msg, fmt.Sprintf("per-caller bound: uid %d holds %d watch streams, the limit per caller is %d", h.uid, defaultPerCaller, defaultPerCaller))
				total = total || strings.Contains(msg, fmt.Sprintf("total bound: callers other than the services hold %d watch streams, the limit is %d (%d in total, 16 kept for the services)", defaultShared, defaultShared, defaultWatchStreams))
			}
		}
		if now > defaultShared {
			t.Errorf("the readers hold %d streams on the %s, more than %d", now, svc, defaultShared)
		}
		if !perCaller || !total {
			t.Errorf("on the %s, a refusal for the per-caller bound: %v, for the total bound: %v; want both, naming the numbers", svc, perCaller, total)
		}
	}
}

// TestWatchHog is the body of the reader processes of
// TestReadersLeaveTheServicesWatchSlots: on each service it keeps
// $NODEPLUG_E2E_WATCH_HOG Watch streams open, reopening one 5 ms after it
// ended and 20 ms after a refusal, and prints what it holds and the first
// refusal of each bound, until it is killed.
func TestWatchHog(t *testing.T) {
	streams, _ := strconv.Atoi(os.Getenv(watchHogEnv))
	if os.Getenv(accessCallerEnv) == "" || streams == 0 {
		t.Skip("run by TestReadersLeaveTheServicesWatchSlots as another user")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out sync.Mutex
	report := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	var wg sync.WaitGroup
	for _, svc := range hogServices {
		conn, err := rpcutil.DialPeer(layout.APISocket(os.Getenv("NODEPLUG_ROOT_DIR"), svc))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var mu sync.Mutex
		held, seen := 0, map[string]bool{}
		change := func(d int) {
			mu.Lock()
			defer mu.Unlock()
			held += d
			report("HELD %s %d", svc, held)
		}
		refused := func(err error) {
			st := status.Convert(err)
			kind := st.Code().String()
			for _, b := range []string{"per-caller bound", "total bound"} {
				if strings.Contains(st.Message(), b) {
					kind = b
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if !seen[kind] {
				seen[kind] = true
				report("REFUSED %s %d %s", svc, st.Code(), st.Message())
			}
		}
		for i := 0; i < streams; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					wait, err := openWatch(ctx, conn, svc)
					delay := 20 * time.Millisecond
					if err == nil {
						change(+1)
						err = wait()
						change(-1)
						delay = 5 * time.Millisecond
					}
					if ctx.Err() == nil {
						refused(err)
					}
					select {
					case <-ctx.Done():
					case <-time.After(delay):
					}
				}
			}()
		}
	}
	wg.Wait()
}

// openWatch opens the Watch stream of svc on conn and returns, once the
// stream synced, a function that reads it until it ends.
func openWatch(ctx context.Context, conn *grpc.ClientConn, svc string) (wait func() error, err error) {
	var recv func() (synced bool, err error)
	if svc == "watcher" {
		ws, err := watcherv1.NewWatcherServiceClient(conn).WatchSocketEvents(ctx, &watcherv1.WatchSocketEventsRequest{})
		if err != nil {
			return nil, err
		}
		recv = func() (bool, error) { r, err := ws.Recv(); return r.GetSynced() != nil, err }
	} else {
		ws, err := dmv1.NewDeviceManagerServiceClient(conn).WatchResources(ctx, &dmv1.WatchResourcesRequest{})
		if err != nil {
			return nil, err
		}
		recv = func() (bool, error) { r, err := ws.Recv(); return r.GetSynced() != nil, err }
	}
	for {
		synced, err := recv()
		if err != nil {
			return nil, err
		}
		if synced {
			break
		}
	}
	return func() error {
		for {
			if _, err := recv(); err != nil {
				return err
			}
		}
	}, nil
}
