package store

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

// kubeletAnswer is a ContainerAllocateResponse in wire format.
func kubeletAnswer(t testing.TB, env string) []byte {
	t.Helper()
	b, err := proto.Marshal(&pluginapi.ContainerAllocateResponse{Envs: map[string]string{"DEV": env}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mirrorAlloc(t testing.TB, pod, resource string, ids ...string) Allocation {
	return Allocation{PodUID: pod, ContainerName: "c", ResourceName: resource, DeviceIDs: ids, Response: kubeletAnswer(t, pod)}
}

// openMirror returns a loaded KubeletMirror over a Journal in dir, flushed
// when the test ends.
func openMirror(t testing.TB, dir string, log *slog.Logger, setup func(*KubeletMirror)) (*KubeletMirror, *Data, error) {
	t.Helper()
	k := WithKubeletMirror(New(dir, Options{}), dir, log)
	if setup != nil {
		setup(k)
	}
	d, err := k.Load()
	t.Cleanup(func() { _ = k.Flush() })
	return k, d, err
}

// mirrored reads the mirror in dir: its allocations by pod UID, and the
// healthy devices per resource.
func mirrored(t testing.TB, dir string) (map[string]Allocation, map[string][]string, error) {
	t.Helper()
	allocs, regs, err := ReadKubelet(KubeletPath(dir))
	if err != nil || allocs == nil && regs == nil {
		return nil, nil, errors.Join(err, errors.New("no mirror yet"))
	}
	out := map[string]Allocation{}
	for _, a := range allocs {
		out[a.PodUID] = a
	}
	return out, regs, nil
}

// TestKubeletFormat: the kubelet's JSON layout and checksum for the
// example of its own checkpoint (the checksum the kubelet computes for it
// is 1063797584; test/upstream checks the same against the kubelet's
// code): field names as keys, NUMA node keys, the answer in base64.
func TestKubeletFormat(t *testing.T) {
	b, err := marshalKubelet(
		[]Resource{{Name: "example.com/dev", Devices: []Device{{ID: "dev1", Healthy: true, NUMANodes: []int64{0}}, {ID: "dev2", Healthy: true}}}},
		[]Allocation{{PodUID: "pod1", ContainerName: "con1", ResourceName: "example.com/dev", DeviceIDs: []string{"dev1"}, Response: []byte{10, 1}}})
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"Data":{"PodDeviceEntries":[{"PodUID":"pod1","ContainerName":"con1","ResourceName":"example.com/dev",` +
		`"DeviceIDs":{"0":["dev1"]},"AllocResp":"CgE="}],"RegisteredDevices":{"example.com/dev":["dev1","dev2"]}},"Checksum":1063797584}`
	if string(b) != want {
		t.Fatalf("kubelet checkpoint\n got %s\nwant %s", b, want)
	}
}

// TestKubeletRoundTrip: what the mirror writes reads back, checksum
// verified: unhealthy devices are not registered, a resource with none
// healthy lists none, a device on two NUMA nodes is under both and one
// with no topology under -1, and an empty answer stays empty. A changed
// byte fails the checksum.
func TestKubeletRoundTrip(t *testing.T) {
	resources := []Resource{
		{Name: "example.com/a", Devices: []Device{{ID: "a1", Healthy: true, NUMANodes: []int64{0, 1}}, {ID: "a2", Healthy: false}, {ID: "a3", Healthy: true}}},
		{Name: "example.com/b", Devices: []Device{{ID: "b1", Healthy: false}}},
		{Name: "example.com/empty", Devices: []Device{}},
	}
	pod2 := mirrorAlloc(t, "pod-2", "example.com/a", "a1", "a2")
	allocs := []Allocation{pod2, {PodUID: "pod-1", ContainerName: "c", ResourceName: "example.com/gone", DeviceIDs: []string{"g1"}}}
	b, err := marshalKubelet(resources, allocs)
	if err != nil {
		t.Fatal(err)
	}
	d, err := unmarshalKubelet(b)
	if err != nil {
		t.Fatal(err)
	}
	wantRegs := map[string][]string{"example.com/a": {"a1", "a3"}, "example.com/b": {}, "example.com/empty": {}}
	if !reflect.DeepEqual(d.RegisteredDevices, wantRegs) {
		t.Errorf("RegisteredDevices = %v, want %v", d.RegisteredDevices, wantRegs)
	}
	if len(d.PodDeviceEntries) != 2 || d.PodDeviceEntries[0].PodUID != "pod-1" {
		t.Fatalf("entries = %+v", d.PodDeviceEntries)
	}
	if got, want := d.PodDeviceEntries[1].DeviceIDs, map[int64][]string{0: {"a1"}, 1: {"a1"}, -1: {"a2"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("DeviceIDs = %v, want %v", got, want)
	}
	if got := d.PodDeviceEntries[0]; !reflect.DeepEqual(got.DeviceIDs, map[int64][]string{-1: {"g1"}}) || got.AllocResp == nil || len(got.AllocResp) != 0 {
		t.Errorf("entry of a gone resource, empty answer = %+v", got)
	}
	back, skipped := kubeletAllocations(d, time.Time{})
	if len(skipped) != 0 || len(back) != 2 || !reflect.DeepEqual(back[1].DeviceIDs, []string{"a1", "a2"}) || !bytes.Equal(back[1].Response, pod2.Response) {
		t.Errorf("allocations read back = %+v, skipped %v", back, skipped)
	}

	i := bytes.Index(b, []byte("a3"))
	tampered := bytes.Clone(b)
	tampered[i+1] = '4'
	if _, err := unmarshalKubelet(tampered); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("a changed byte: %v", err)
	}
}

// TestKubeletMirrorCoalesces: a thousand changes made while the mirror's
// first write is in flight cost one more write, and that write holds the
// last state. Nothing here is timed: the first write is held until the
// changes are made.
func TestKubeletMirrorCoalesces(t *testing.T) {
	dir := testutil.TempDir(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	k, _, err := openMirror(t, dir, nil, func(k *KubeletMirror) {
		k.beforeInstall = func() {
			once.Do(func() { close(entered); <-release })
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Append(Batch{Resources: []Resource{{Name: "example.com/r", Devices: []Device{{ID: "d0", Healthy: true}}}}}); err != nil {
		t.Fatal(err)
	}
	<-entered
	const changes = 1000
	var last Ticket
	for i := range changes {
		a := mirrorAlloc(t, fmt.Sprintf("pod-%04d", i), "example.com/r", "d0")
		if _, err = k.Append(Batch{Allocations: []Allocation{a}}); err != nil {
			t.Fatal(err)
		}
	}
	// The last change releases one allocation and adds another: the file
	// must show both.
	if last, err = k.Append(Batch{
		RemovedAllocations: []AllocationKey{{PodUID: "pod-0000", ContainerName: "c", ResourceName: "example.com/r"}},
		Allocations:        []Allocation{mirrorAlloc(t, "pod-last", "example.com/r", "d0")},
	}); err != nil {
		t.Fatal(err)
	}
	if err := k.Wait(last); err != nil {
		t.Fatal(err)
	}
	close(release)
	testutil.Eventually(t, "the last state in the mirror", func() error {
		allocs, _, err := mirrored(t, dir)
		if err != nil {
			return err
		}
		if _, gone := allocs["pod-0000"]; gone || allocs["pod-last"].PodUID == "" || len(allocs) != changes {
			return errors.New("not yet")
		}
		return nil
	})
	// Flush stops the writer (its last write finds nothing new), so that
	// the count is final.
	if err := k.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := k.writes.Load(); n != 2 {
		t.Fatalf("%d writes for %d changes made during the first write, want 2", n, changes+1)
	}
}

// TestKubeletMirrorAtomic: while a write is in flight the file holds the
// previous state, whole, and the new one is a dot-named temporary file
// beside it; once written the file is 0600, no temporary file is left, a
// link planted at the name is replaced (its target untouched), and a
// reader never sees anything but a whole, verified checkpoint.
func TestKubeletMirrorAtomic(t *testing.T) {
	dir := testutil.TempDir(t)
	path := KubeletPath(dir)
	target := filepath.Join(dir, "elsewhere")
	if err := os.WriteFile(target, []byte("not the mirror"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, kubeletTempPrefix+"left-by-a-crash"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	hold := make(chan chan struct{}, 1)
	k, _, err := openMirror(t, dir, nil, func(k *KubeletMirror) {
		k.interval = 0
		k.beforeInstall = func() {
			select {
			case release := <-hold:
				release <- struct{}{}
				<-release
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	temps := func() []string {
		m, _ := filepath.Glob(filepath.Join(dir, kubeletTempPrefix+"*"))
		return m
	}
	if m := temps(); len(m) != 0 {
		t.Fatalf("temporary files left by a crash not removed at Load: %v", m)
	}
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	r := Resource{Name: "example.com/r", Devices: []Device{{ID: "d0", Healthy: true}, {ID: "d1", Healthy: true}}}
	commitMirror(t, k, Batch{Resources: []Resource{r}, Allocations: []Allocation{mirrorAlloc(t, "pod-1", r.Name, "d0")}})
	testutil.Eventually(t, "the first state", func() error {
		allocs, _, err := mirrored(t, dir)
		if err == nil && len(allocs) != 1 {
			err = errors.New("not yet")
		}
		return err
	})
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the mirror: %v, %v; want a regular file, mode 0600", fi.Mode(), err)
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "not the mirror" {
		t.Fatalf("written through the planted link: %q, %v", b, err)
	}

	// The second write is held after its temporary file is written.
	release := make(chan struct{})
	hold <- release
	commitMirror(t, k, Batch{Allocations: []Allocation{mirrorAlloc(t, "pod-2", r.Name, "d1")}})
	<-release
	if allocs, _, err := mirrored(t, dir); err != nil || len(allocs) != 1 {
		t.Fatalf("during a write the file holds %v, %v; want the previous state", allocs, err)
	}
	if m := temps(); len(m) != 1 {
		t.Fatalf("temporary files during a write: %v", m)
	}
	release <- struct{}{}
	testutil.Eventually(t, "the second state", func() error {
		allocs, _, err := mirrored(t, dir)
		if err == nil && len(allocs) != 2 {
			err = errors.New("not yet")
		}
		return err
	})
	if m := temps(); len(m) != 0 {
		t.Fatalf("temporary files after a write: %v", m)
	}

	// A reader racing many writes sees only whole checkpoints.
	stop := make(chan struct{})
	var bad error
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, _, err := mirrored(t, dir); err != nil {
				bad = err
				return
			}
		}
	})
	for i := range 100 {
		commitMirror(t, k, Batch{Allocations: []Allocation{mirrorAlloc(t, "pod-x", r.Name, []string{"d0", "d1"}[i%2])}})
	}
	close(stop)
	wg.Wait()
	if bad != nil {
		t.Fatalf("a reader saw: %v", bad)
	}
}

func commitMirror(t testing.TB, k *KubeletMirror, b Batch) {
	t.Helper()
	if err := Commit(k, b); err != nil {
		t.Fatal(err)
	}
}

// writeKubelet writes a kubelet checkpoint in dir, as the kubelet would.
func writeKubelet(t testing.TB, dir string, resources []Resource, allocs []Allocation) []byte {
	t.Helper()
	b, err := marshalKubelet(resources, allocs)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(KubeletPath(dir), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestKubeletImport: at a first start the kubelet's allocations are
// imported, durable in nodeplug's own checkpoint before Load returns (a
// journal opened alone finds them), logged, entries nodeplug cannot take
// named; at the next start nodeplug's checkpoint is the truth and nothing
// is imported again.
func TestKubeletImport(t *testing.T) {
	dir := testutil.TempDir(t)
	r := Resource{Name: "example.com/r", Devices: []Device{{ID: "d0", Healthy: true, NUMANodes: []int64{0}}, {ID: "d1", Healthy: true}}}
	bad := mirrorAlloc(t, "pod-bad", r.Name, "d2")
	bad.Response = []byte{0xff, 0xff}
	writeKubelet(t, dir, []Resource{r}, []Allocation{mirrorAlloc(t, "pod-1", r.Name, "d0", "d1"), bad})
	var logs bytes.Buffer
	k := WithKubeletMirror(New(dir, Options{}), dir, slog.New(slog.NewTextHandler(&logs, nil)))
	d, err := k.Load()
	if err != nil {
		t.Fatal(err)
	}
	if d == nil || len(d.Allocations) != 1 || d.Allocations[0].PodUID != "pod-1" || !reflect.DeepEqual(d.Allocations[0].DeviceIDs, []string{"d0", "d1"}) ||
		!bytes.Equal(d.Allocations[0].Response, kubeletAnswer(t, "pod-1")) || len(d.Resources) != 0 {
		t.Fatalf("imported %+v", d)
	}
	for _, want := range []string{"imported the kubelet's allocations", "allocations=1", "pod-bad", "cannot be read"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
	// Durable before Load returned: a crash now keeps them.
	if d, err := ReadState(dir); err != nil || d == nil || len(d.Allocations) != 1 {
		t.Fatalf("nodeplug's checkpoint after the import: %+v, %v", d, err)
	}
	if err := k.Flush(); err != nil {
		t.Fatal(err)
	}

	// The next start: a kubelet checkpoint with something else is the
	// mirror's to overwrite, not to import.
	writeKubelet(t, dir, nil, []Allocation{mirrorAlloc(t, "pod-other", r.Name, "d1")})
	_, d, err = openMirror(t, dir, nil, nil)
	if err != nil || len(d.Allocations) != 1 || d.Allocations[0].PodUID != "pod-1" {
		t.Fatalf("second start: %+v, %v", d, err)
	}
}

// TestKubeletImportUnreadable: a kubelet checkpoint that does not verify
// (an older format, a damaged file) is moved aside, never overwritten, and
// reported as a CorruptError; the service starts empty and the mirror is
// written from then on.
func TestKubeletImportUnreadable(t *testing.T) {
	for name, content := range map[string]string{
		"empty object": "{}",
		"version 1":    `{"Data":{"PodDeviceEntries":[{"PodUID":"p","ContainerName":"c","ResourceName":"example.com/r","DeviceIDs":["d"],"AllocResp":""}],"RegisteredDevices":{}},"Checksum":1}`,
		"not JSON":     "\x00\x01",
	} {
		t.Run(name, func(t *testing.T) {
			dir := testutil.TempDir(t)
			if err := os.WriteFile(KubeletPath(dir), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			k, d, err := openMirror(t, dir, nil, nil)
			ces := Corruptions(err)
			if d != nil || len(ces) != 1 || !OnlyCorruptions(err) || ces[0].Path != KubeletPath(dir) {
				t.Fatalf("Load: %+v, %v", d, err)
			}
			if b, err := os.ReadFile(ces[0].MovedTo); err != nil || string(b) != content {
				t.Fatalf("moved aside: %q, %v", b, err)
			}
			commitMirror(t, k, Batch{Resources: []Resource{{Name: "example.com/r", Devices: []Device{{ID: "d0", Healthy: true}}}}})
			testutil.Eventually(t, "the mirror", func() error {
				_, regs, err := mirrored(t, dir)
				if err == nil && len(regs["example.com/r"]) != 1 {
					err = errors.New("not yet")
				}
				return err
			})
		})
	}
}

// TestKubeletNotImportedBesideDamagedState: when nodeplug's own checkpoint
// was there but is moved aside, this is no first start: the kubelet-format
// file is not imported.
func TestKubeletNotImportedBesideDamagedState(t *testing.T) {
	dir := testutil.TempDir(t)
	writeKubelet(t, dir, nil, []Allocation{mirrorAlloc(t, "pod-1", "example.com/r", "d0")})
	if err := os.WriteFile(Path(dir), []byte("damaged"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, d, err := openMirror(t, dir, nil, nil)
	if d != nil || len(Corruptions(err)) != 1 || Corruptions(err)[0].Path != Path(dir) {
		t.Fatalf("Load: %+v, %v", d, err)
	}
}

// benchStore returns a loaded Journal in dir over a state of 10,000
// devices and 1,000 allocations, wrapped in a KubeletMirror when mirrored.
func benchStore(b *testing.B, mirrored bool) (Store, *Data) {
	b.Helper()
	dir := testutil.TempDir(b)
	d := benchData(10000, 1000)
	st, err := stateOf(d)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := writeSnapshot(Path(dir), 1, st); err != nil {
		b.Fatal(err)
	}
	var s Store = New(dir, Options{CompactAt: 1 << 40})
	if mirrored {
		s = WithKubeletMirror(s, dir, nil)
	}
	if _, err := s.Load(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Flush() })
	return s, d
}

// BenchmarkMirrorAppend measures what the mirror adds to the path of a
// change (an Allocate's): one Append (encode and stage, the sync left out)
// to the Journal alone, and to the Journal in a KubeletMirror whose writer
// runs meanwhile, beside a state of 10,000 devices and 1,000 allocations.
func BenchmarkMirrorAppend(b *testing.B) {
	for _, mirrored := range []bool{false, true} {
		b.Run(fmt.Sprintf("mirror=%v", mirrored), func(b *testing.B) {
			s, d := benchStore(b, mirrored)
			a := d.Allocations[0]
			b.ResetTimer()
			for i := range b.N {
				a.PodUID = fmt.Sprintf("bench-%d", i%1000)
				t, err := s.Append(Batch{Allocations: []Allocation{a}})
				if err != nil {
					b.Fatal(err)
				}
				if i%1000 == 999 {
					b.StopTimer()
					if err := s.Wait(t); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			}
		})
	}
}

// BenchmarkMirrorWrite measures one write of the mirror (encode, checksum,
// temporary file, fsync, rename, directory fsync) of a state of 10,000
// devices and 1,000 allocations: the background cost, at most one per
// KubeletInterval.
func BenchmarkMirrorWrite(b *testing.B) {
	s, _ := benchStore(b, true)
	k := s.(*KubeletMirror)
	b.ResetTimer()
	for range b.N {
		k.mu.Lock()
		k.changes++
		k.mu.Unlock()
		if err := k.write(); err != nil {
			b.Fatal(err)
		}
	}
}
