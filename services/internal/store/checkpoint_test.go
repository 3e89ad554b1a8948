package store

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

func sample() *Data {
	return &Data{
		Resources: []Resource{{Name: "example.com/a", Devices: []Device{{ID: "d0", Healthy: true}, {ID: "d1", NUMANodes: []int64{0}}},
			Endpoints: []Endpoint{{Endpoint: "/x/a.sock", SocketPath: "/x/a.sock", Generation: "g1", RegistrationPath: "REGISTRATION_PATH_KUBELET_SOCK",
				Versions: []string{"v1beta1"}, Registered: time.Unix(100, 5).UTC(), Primary: true}}}},
		Allocations: []Allocation{
			{PodUID: "p", ContainerName: "c", ResourceName: "example.com/a", DeviceIDs: []string{"d0"},
				Response: []byte{10, 1, 2}, TraceID: "abc", Allocated: time.Unix(200, 0).UTC()},
			{PodUID: "q", PodNamespace: "default", PodName: "web-0", ContainerName: "c", ResourceName: "example.com/a",
				DeviceIDs: []string{"d1"}, Response: []byte{}, Allocated: time.Unix(300, 0).UTC()},
		},
	}
}

// A checkpoint written before allocations carried the pod's namespace and
// name reads with both empty.
func TestReadWithoutPodIdentity(t *testing.T) {
	data := `{"resources":[],"allocations":[{"pod_uid":"p","container_name":"c","resource_name":"example.com/a",` +
		`"device_ids":["d0"],"response":"CgEC","allocated":"1970-01-01T00:03:20Z"}]}`
	file := `{"version":1,"checksum":"` + checksum([]byte(data)) + `","data":` + data + `}`
	d, err := unmarshal([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	a := d.Allocations[0]
	if a.PodUID != "p" || a.PodNamespace != "" || a.PodName != "" || len(a.DeviceIDs) != 1 {
		t.Fatalf("allocation = %+v", a)
	}
}

func TestSaveLoadRoundTrip(t *testing.T) {
	dir := testutil.TempDir(t)
	path := Path(dir)
	if d, err := ReadFile(path); d != nil || err != nil {
		t.Fatalf("missing file: %v, %v", d, err)
	}
	st, err := stateOf(sample())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := writeSnapshot(path, 1, st); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, sample()) {
		t.Fatalf("round trip:\n%+v\n%+v", got, sample())
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v", fi.Mode(), err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
}

func TestLoadRejects(t *testing.T) {
	good, err := marshal(sample())
	if err != nil {
		t.Fatal(err)
	}
	tampered := strings.Replace(string(good), `"d0"`, `"d9"`, 1)
	tests := []struct {
		name string
		data string
	}{
		{"empty", ""},
		{"garbage", "not json at all"},
		{"truncated", string(good[:len(good)/2])},
		{"tampered", tampered},
		{"other version", strings.Replace(string(good), `"version":2`, `"version":3`, 1)},
		{"version 1 naming a journal", strings.Replace(string(good), `"version":2`, `"version":1`, 1)},
		{"kubelet's format", `{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":1}`},
		{"no data", `{"version":1,"checksum":"sha256:00"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := unmarshal([]byte(tc.data)); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("err = %v, want ErrCorrupt", err)
			}
		})
	}
}

func TestMoveAside(t *testing.T) {
	dir := testutil.TempDir(t)
	path := Path(dir)
	if err := os.WriteFile(path, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	aside, err := moveAside(path, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(filepath.Base(aside), FileName+".corrupt-") {
		t.Fatalf("moved to %s", aside)
	}
	if b, err := os.ReadFile(aside); err != nil || string(b) != "junk" {
		t.Fatalf("aside content %q, %v", b, err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("original still there: %v", err)
	}
}

// TestMarshalSnapshotMatchesStructEncoding: the hand-built encoding carries
// exactly what encoding/json makes of Data (with the journal's number), so
// the checksum covers the same bytes.
func TestMarshalSnapshotMatchesStructEncoding(t *testing.T) {
	d := benchData(3, 2)
	b, err := marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	var env envelope
	if err := json.Unmarshal(b, &env); err != nil {
		t.Fatal(err)
	}
	want, err := json.Marshal(struct {
		Journal uint64 `json:"journal"`
		*Data
	}{0, d})
	if err != nil {
		t.Fatal(err)
	}
	if string(env.Data) != string(want) {
		t.Fatalf("data section\n%s\nwant\n%s", env.Data, want)
	}
	if _, err := unmarshal(b); err != nil {
		t.Fatal(err)
	}
	empty, err := marshal(&Data{Resources: []Resource{}, Allocations: []Allocation{}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unmarshal(empty); err != nil {
		t.Fatalf("empty checkpoint: %v", err)
	}
}
