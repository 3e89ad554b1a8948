package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// BareResult is what a bare grpc-go client costs per device plugin: one
// connection with one open ListAndWatch stream (its first answer
// received), measured in a process of its own that does nothing else.
type BareResult struct {
	Conns            int     `json:"conns"`
	RSSKiBBefore     float64 `json:"rss_kib_before"`
	RSSKiBAfter      float64 `json:"rss_kib_after"`
	KiBPerConn       float64 `json:"rss_kib_per_conn"`
	GoroutinesBefore int     `json:"goroutines_before"`
	GoroutinesAfter  int     `json:"goroutines_after"`
	GoroutinesPer    float64 `json:"goroutines_per_conn"`
	// What the runtime says of the same interval, per connection: live
	// heap (HeapAlloc), heap spans in use (HeapInuse) and goroutine
	// stacks (StackInuse), to set beside the devicemanager's MemStats.
	HeapAllocKiBPerConn float64 `json:"heap_alloc_kib_per_conn"`
	HeapInuseKiBPerConn float64 `json:"heap_inuse_kib_per_conn"`
	StackKiBPerConn     float64 `json:"stack_kib_per_conn"`
	// Once every connection is closed and its goroutines have ended, and
	// the freed memory went back to the OS as above: the process's RSS,
	// and over RSSKiBBefore. What stays is grpc-go's and the Go runtime's
	// own (the runtime never frees a goroutine's descriptor, so a process
	// keeps about 0.5 KiB for each goroutine it ever ran at once): the
	// least any grpc-go client keeps after such a burst, to set beside
	// the devicemanager's figure after its plugins left.
	RSSKiBClosed     float64 `json:"rss_kib_closed"`
	GoroutinesClosed int     `json:"goroutines_closed"`
	ClosedOverBefore float64 `json:"closed_over_before"`
}

// BareClientFlag is the hidden flag of nodeplug-bench that runs BareClient
// over the endpoints listed, one a line, in the file it names.
const BareClientFlag = "bare-client"

// BareClient dials every endpoint in paths with grpc-go and nothing else
// (no interceptors, stats handlers or logging), opens ListAndWatch on each
// and takes its first answer, then reports the process's RSS and
// goroutines before and after, with the connections still open, and once
// they are closed again.
func BareClient(ctx context.Context, paths []string) (BareResult, error) {
	out := BareResult{Conns: len(paths)}
	runtime.GC()
	before, err := sampleMemory()
	if err != nil {
		return out, err
	}
	out.RSSKiBBefore, out.GoroutinesBefore = before.rssKiB, before.goroutines
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for _, p := range paths {
		c, err := floorDial(p)
		if err != nil {
			return out, err
		}
		conns = append(conns, c)
		st, err := pluginapi.NewDevicePluginClient(c).ListAndWatch(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
		if err != nil {
			return out, fmt.Errorf("ListAndWatch %s: %w", p, err)
		}
		if _, err := st.Recv(); err != nil {
			return out, fmt.Errorf("first ListAndWatch answer of %s: %w", p, err)
		}
	}
	after, err := settledMemory()
	if err != nil {
		return out, err
	}
	out.RSSKiBAfter, out.GoroutinesAfter = after.rssKiB, after.goroutines
	if n := len(paths); n > 0 {
		out.KiBPerConn = round2((out.RSSKiBAfter - out.RSSKiBBefore) / float64(n))
		out.GoroutinesPer = round2(float64(out.GoroutinesAfter-out.GoroutinesBefore) / float64(n))
		perConn := func(after, before uint64) float64 {
			return round2((float64(after) - float64(before)) / 1024 / float64(n))
		}
		out.HeapAllocKiBPerConn = perConn(after.stats.HeapAlloc, before.stats.HeapAlloc)
		out.HeapInuseKiBPerConn = perConn(after.stats.HeapInuse, before.stats.HeapInuse)
		out.StackKiBPerConn = perConn(after.stats.StackInuse, before.stats.StackInuse)
	}

	for _, c := range conns {
		_ = c.Close()
	}
	conns = nil
	// Closing ends each connection's goroutines soon after, not at once.
	for deadline := time.Now().Add(30 * time.Second); runtime.NumGoroutine() > out.GoroutinesBefore && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	closed, err := settledMemory()
	if err != nil {
		return out, err
	}
	out.RSSKiBClosed, out.GoroutinesClosed = closed.rssKiB, closed.goroutines
	out.ClosedOverBefore = ratio(out.RSSKiBClosed, out.RSSKiBBefore)
	return out, nil
}

// memorySample is this process's RSS (KiB), goroutines and MemStats at
// one moment.
type memorySample struct {
	rssKiB     float64
	goroutines int
	stats      runtime.MemStats
}

func sampleMemory() (memorySample, error) {
	rss, err := rssMiB(os.Getpid())
	if err != nil {
		return memorySample{}, err
	}
	s := memorySample{rssKiB: round2(rss * 1024), goroutines: runtime.NumGoroutine()}
	runtime.ReadMemStats(&s.stats)
	return s, nil
}

// settledMemory samples as the devicemanager is measured: once a burst of
// arrivals has settled, it collects garbage and returns the freed memory to
// the OS (manager.GiveBack), then sits idle until its RSS is read. The bare
// client does the same, so that neither side counts garbage or free pages
// the other does not.
func settledMemory() (memorySample, error) {
	debug.FreeOSMemory()
	time.Sleep(time.Second)
	return sampleMemory()
}

// bareClient runs BareClient over paths in a child process (this
// executable with BareClientFlag), so that the plugins' servers in this
// process are not counted.
func (r *runner) bareClient(ctx context.Context, paths []string) (BareResult, error) {
	var out BareResult
	self, err := os.Executable()
	if err != nil {
		return out, err
	}
	list := filepath.Join(r.root, "bare-endpoints")
	if err := os.WriteFile(list, []byte(strings.Join(paths, "\n")), 0o600); err != nil {
		return out, err
	}
	defer os.Remove(list)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, self, "-"+BareClientFlag, list)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	data, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("bare client: %w: %s", err, stderr.String())
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return out, fmt.Errorf("bare client: %w: %q", err, data)
	}
	return out, nil
}
