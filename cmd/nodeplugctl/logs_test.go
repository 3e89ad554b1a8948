package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/podlogs"
	"github.com/nodeplug/nodeplug/services/apiserver/apiservertest"
)

// writeLog writes a CRI log file of the pod's container, as its runtime
// writes it.
func writeLog(t *testing.T, root string, pod *corev1.Pod, container string, restart int, lines ...string) {
	t.Helper()
	path := podlogs.File(podlogs.Dir(root, pod.Namespace, pod.Name, string(pod.UID)), container, restart)
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, strings.Join(lines, "\n")+"\n")
}

// TestLogs: nodeplugctl logs reads a container's log from the runtime's
// files under the root dir: the only container by default, -c, -p, --tail,
// --timestamps, -o json; partial lines joined; clear errors for a
// container that is not the pod's, that has not started, or that was not
// restarted.
func TestLogs(t *testing.T) {
	root := testutil.TempDir(t)
	api := apiservertest.Start(t, root, "node-a")
	ctx := context.Background()
	mk := func(name string, containers ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
		for _, c := range containers {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c, Image: "example.com/app:1"})
		}
		p, err := api.Client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	one, two := mk("one", "main"), mk("two", "app", "sidecar")
	writeLog(t, root, one, "main", 0,
		"2026-12-06T10:00:00.000000001+00:00 stdout F first start")
	writeLog(t, root, one, "main", 1,
		"2026-12-06T10:01:00.000000001+00:00 stdout F hello",
		"2026-12-06T10:01:01.000000001+00:00 stderr P warn",
		"2026-12-06T10:01:01.500000001+00:00 stderr F ing",
		"2026-12-06T10:01:02.000000001+00:00 stdout F bye")
	writeLog(t, root, two, "app", 0, "2026-12-06T10:00:00Z stdout F app's line")

	for _, tc := range []struct {
		args       []string
		out, sterr string
	}{
		{[]string{"logs", "default/one"}, "hello\nwarning\nbye\n", ""},
		{[]string{"logs", "one", "--tail", "1"}, "bye\n", ""},
		{[]string{"logs", "pod/one", "-p"}, "first start\n", ""},
		{[]string{"logs", "one", "--timestamps", "--tail", "2"}, "2026-12-06T10:01:01.000000001Z warning\n2026-12-06T10:01:02.000000001Z bye\n", ""},
		{[]string{"logs", "two"}, "app's line\n", `Defaulted container "app" out of: app, sidecar`},
		{[]string{"logs", "two", "-c", "app"}, "app's line\n", ""},
	} {
		code, out, errOut := runCLI(t, append([]string{"--root-dir", root}, tc.args...)...)
		if code != exitOK || out != tc.out || !strings.Contains(errOut, tc.sterr) {
			t.Errorf("%q: exit %d: %q %q, want %q %q", tc.args, code, out, errOut, tc.out, tc.sterr)
		}
	}
	code, out, errOut := runCLI(t, "--root-dir", root, "logs", "one", "-o", "json")
	var lines []logLine
	if err := json.Unmarshal([]byte(out), &lines); code != exitOK || err != nil || len(lines) != 3 || lines[1].Stream != "stderr" || lines[1].Log != "warning" {
		t.Errorf("logs -o json: exit %d, %v: %s%s", code, err, out, errOut)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"logs", "two", "-c", "nope"}, "container nope is not in pod default/two; its containers: app, sidecar"},
		{[]string{"logs", "two", "-c", "sidecar"}, "container sidecar of pod default/two has no log"},
		{[]string{"logs", "two", "-c", "app", "-p"}, "container app of pod default/two has not been restarted"},
		{[]string{"logs", "missing"}, "pod default/missing not found"},
	} {
		code, out, errOut := runCLI(t, append([]string{"--root-dir", root}, tc.args...)...)
		if code != exitError || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d: %q %q, want error %q", tc.args, code, out, errOut, tc.want)
		}
	}
	code, _, errOut = runCLI(t, "--root-dir", root, "logs")
	if code != exitUsage || !strings.Contains(errOut, "name one pod") {
		t.Errorf("logs without a pod: exit %d: %s", code, errOut)
	}
}
