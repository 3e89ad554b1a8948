package podlogs_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/nodeplug/nodeplug/pkg/podlogs"
)

func TestPaths(t *testing.T) {
	dir := podlogs.Dir("/var/lib/kubelet", "default", "web", "6f1c-22")
	if want := "/var/lib/kubelet/pod-logs/default_web_6f1c-22"; dir != want {
		t.Errorf("Dir = %q, want %q", dir, want)
	}
	if got, want := podlogs.File(dir, "app", 3), "/var/lib/kubelet/pod-logs/default_web_6f1c-22/app/3.log"; got != want {
		t.Errorf("File = %q, want %q", got, want)
	}
	if podlogs.DirName != "pod-logs" {
		t.Errorf("DirName = %q", podlogs.DirName)
	}
}

func TestLatest(t *testing.T) {
	pod := t.TempDir()
	ctr := filepath.Join(pod, "app")
	if err := os.MkdirAll(filepath.Join(ctr, "11.log"), 0o755); err != nil { // a directory: not a log
		t.Fatal(err)
	}
	// 2 is the highest N of an N.log file: the rest are rotated logs,
	// names that only look like one, and a directory.
	for _, name := range []string{"0.log", "10.log.20260102-150405", "2.log", "1.log", "x.log", ".log", "-3.log", "+4.log", "5.log.gz", "99999999999999999999999.log"} {
		if err := os.WriteFile(filepath.Join(ctr, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	path, restart, err := podlogs.Latest(pod, "app")
	if err != nil || restart != 2 || path != filepath.Join(ctr, "2.log") {
		t.Fatalf("Latest = %q, %d, %v; want %s, 2", path, restart, err, filepath.Join(ctr, "2.log"))
	}

	if err := os.Mkdir(filepath.Join(pod, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"empty", "missing"} {
		if path, _, err := podlogs.Latest(pod, c); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Latest of container %s = %q, %v; want an error wrapping os.ErrNotExist", c, path, err)
		}
	}
}
