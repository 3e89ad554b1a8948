package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
)

// Ports of the compose test's own stack, free loopback ports picked when it
// starts (pickComposePorts), so it never collides with a running
// `make run` or `make up`, or with another stack of its own.
var composePorts = map[string]string{
	"NODEPLUG_WATCHER_METRICS_PORT":       "",
	"NODEPLUG_RECONCILER_METRICS_PORT":    "",
	"NODEPLUG_DEVICEMANAGER_METRICS_PORT": "",
	"NODEPLUG_APISERVER_METRICS_PORT":     "",
	"NODEPLUG_DRAMANAGER_METRICS_PORT":    "",
	"NODEPLUG_JAEGER_PORT":                "",
	"NODEPLUG_CONSOLE_PORT":               "",
}

// pickComposePorts fills composePorts with distinct free loopback ports
// (held open together while they are picked, released for Docker to bind).
func pickComposePorts(t *testing.T) {
	t.Helper()
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	for k := range composePorts {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
		composePorts[k] = strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	}
}

const composeProject = "nodeplug-e2e"

// TestCompose brings the compose stack up with `make up` under its own
// project name and ports, waits for the sample plugin to register, allocates
// through nodeplugctl, finds the registration trace in Jaeger's query API
// with spans from the three services it crosses, checks that
// nodeplug-apiserver's metrics answer on their published port (the
// dramanager's too, published by the apiserver service whose network
// namespace it shares), and takes it down with `make down`.
// It runs when a Docker engine answers and is skipped, saying so, otherwise.
func TestCompose(t *testing.T) {
	if testing.Short() {
		t.Skip("builds images and Jaeger")
	}
	if err := exec.Command("docker", "info").Run(); err != nil {
		t.Skipf("no Docker engine answers (docker info: %v): compose test skipped", err)
	}
	root, err := stack.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	pickComposePorts(t)
	env := append(os.Environ(), "COMPOSE_PROJECT="+composeProject)
	for k, v := range composePorts {
		env = append(env, k+"="+v)
	}
	run := func(timeout time.Duration, name string, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = root
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() {
		if out, err := run(5*time.Minute, "make", "down"); err != nil {
			t.Errorf("make down: %v\n%s", err, out)
		}
	})
	if out, err := run(40*time.Minute, "make", "up"); err != nil {
		logs, _ := run(time.Minute, "docker", "compose", "-p", composeProject, "logs", "--no-color")
		t.Fatalf("make up: %v\n%s\ncompose logs:\n%s", err, out, logs)
	}

	// The host reaches the APIs as docs/getting-started.md says: nodeplugctl in a
	// container on the stack's volume, or, as root, through the volume's
	// mount point.
	if out, err := run(2*time.Minute, "docker", "compose", "-p", composeProject, "run", "--rm", "nodeplugctl", "resources"); err != nil {
		t.Fatalf("docker compose run nodeplugctl resources: %v\n%s", err, out)
	}
	mount, err := run(time.Minute, "docker", "volume", "inspect", "-f", "{{.Mountpoint}}", composeProject+"_kubelet")
	if err != nil {
		t.Fatalf("docker volume inspect: %v\n%s", err, mount)
	}
	ctl := func(args ...string) (string, error) {
		full := append([]string{
			"--root-dir", strings.TrimSpace(mount),
			"--jaeger-url", "http://127.0.0.1:" + composePorts["NODEPLUG_JAEGER_PORT"],
		}, args...)
		return run(time.Minute, filepath.Join(root, "bin", "nodeplugctl"), full...)
	}

	var resources []map[string]any
	testutil.Eventually(t, "the sample plugin's resource is allocatable", func() error {
		out, err := ctl("resources", "-o", "json")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		var doc map[string]any
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			return fmt.Errorf("resources -o json: %v: %s", err, out)
		}
		resources = nil
		for _, r := range asList(doc["resources"]) {
			m, _ := r.(map[string]any)
			resources = append(resources, m)
			if m["name"] == "example.com/sample" && fmt.Sprint(m["allocatable"]) == "4" {
				return nil
			}
		}
		return fmt.Errorf("example.com/sample not allocatable yet: %s", out)
	})

	if out, err := ctl("allocate", "--pod", "compose-pod", "--container", "main", "example.com/sample=2"); err != nil {
		t.Fatalf("nodeplugctl allocate: %v\n%s", err, out)
	}
	out, err := ctl("allocations", "-o", "json")
	if err != nil || !strings.Contains(out, "compose-pod") {
		t.Fatalf("nodeplugctl allocations: %v\n%s", err, out)
	}

	// The registration trace, by the trace ID the reconciler shows.
	out, err = ctl("plugins", "-o", "json")
	if err != nil {
		t.Fatalf("nodeplugctl plugins: %v\n%s", err, out)
	}
	var plugins map[string]any
	if err := json.Unmarshal([]byte(out), &plugins); err != nil {
		t.Fatalf("plugins -o json: %v\n%s", err, out)
	}
	traceID := ""
	for _, p := range asList(plugins["plugins"]) {
		m, _ := p.(map[string]any)
		if m["name"] == "example.com/sample" {
			traceID, _ = m["lastTraceId"].(string)
		}
	}
	if traceID == "" {
		t.Fatalf("no trace ID for the sample plugin:\n%s", out)
	}
	jaeger := "http://127.0.0.1:" + composePorts["NODEPLUG_JAEGER_PORT"]
	testutil.Eventually(t, "the registration trace in Jaeger with the three services it crosses", func() error {
		resp, err := http.Get(jaeger + "/api/traces/" + traceID)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d: %s", resp.StatusCode, body)
		}
		for _, svc := range []string{svcWatcher, svcReconciler, svcDeviceManager} {
			if !strings.Contains(string(body), `"serviceName":"`+svc+`"`) {
				return fmt.Errorf("trace %s has no spans from %s yet", traceID, svc)
			}
		}
		return nil
	})
	if out, err := ctl("trace", traceID); err != nil || !strings.Contains(out, svcDeviceManager) {
		t.Errorf("nodeplugctl trace: %v\n%s", err, out)
	} else {
		t.Logf("nodeplugctl trace %s:\n%s", traceID, out)
	}
	for _, port := range []string{"NODEPLUG_APISERVER_METRICS_PORT", "NODEPLUG_DEVICEMANAGER_METRICS_PORT", "NODEPLUG_DRAMANAGER_METRICS_PORT"} {
		checkMetrics(t, "http://127.0.0.1:"+composePorts[port]+"/metrics")
	}
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// TestComposeFileAccessRules reads docker-compose.yaml (no Docker needed):
// every published port binds the host's loopback, no gRPC port or old
// --listen setting is left, the healthchecks check the API sockets, every
// nodeplug container mounts the shared kubelet volume, where the services
// reach each other's sockets, and runs its own image, a target of the
// Dockerfile; the dramanager shares nodeplug-apiserver's network
// namespace, where the resource API's loopback address is, and the
// devicemanager, which reads no Kubernetes API, does not.
func TestComposeFileAccessRules(t *testing.T) {
	root, err := stack.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	c := readCompose(t, filepath.Join(root, "docker-compose.yaml"))
	dockerfile, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for svc, ps := range c.ports {
		for _, p := range ps {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("service %s publishes %q: ports must bind 127.0.0.1 on the host", svc, p)
			}
		}
	}
	for _, svc := range stack.Services {
		if h := c.health[svc]; !strings.Contains(h, `"/nodeplug-`+svc+`", "healthcheck"`) {
			t.Errorf("service %s: healthcheck %q, want its binary's healthcheck on the API socket", svc, h)
		}
	}
	for _, svc := range append(slices.Clone(stack.Services), "sampleplugin", "console", "nodeplugctl") {
		if !c.volume[svc] {
			t.Errorf("service %s does not mount the kubelet volume at /var/lib/kubelet", svc)
		}
		if want := "nodeplug/" + svc + ":dev"; c.image[svc] != want {
			t.Errorf("service %s runs image %q, want %q", svc, c.image[svc], want)
		}
		if !strings.Contains(string(dockerfile), "\nFROM scratch AS "+svc+"\n") {
			t.Errorf("the Dockerfile has no target %s for the image of service %s", svc, svc)
		}
	}
	if got := c.network["dramanager"]; got != "service:apiserver" {
		t.Errorf("the dramanager's network_mode is %q, want \"service:apiserver\" (the resource API listens on the apiserver's loopback)", got)
	}
	if got := c.network["console"]; got != "service:apiserver" {
		t.Errorf("the console's network_mode is %q, want \"service:apiserver\" (it reads the pods from the resource API on the apiserver's loopback)", got)
	}
	if got := c.network["devicemanager"]; got != "" {
		t.Errorf("the devicemanager's network_mode is %q, want its own network (it reads no Kubernetes API)", got)
	}
	// Every long-running service says when it is ready, so that make up
	// --wait returns a stack that answers; nodeplugctl is a one-shot tool.
	wantHealth := append(append([]string{"jaeger"}, stack.Services...), "sampleplugin", "console")
	for _, svc := range wantHealth {
		if c.health[svc] == "" {
			t.Errorf("service %s has no healthcheck", svc)
		}
	}
	if len(c.ports) == 0 || len(c.health) != len(wantHealth) {
		t.Fatalf("read %d services with ports and %d healthchecks (want %d): the file's layout changed, update this test", len(c.ports), len(c.health), len(wantHealth))
	}
}

// composeFile is what TestComposeFileAccessRules reads of each service of
// docker-compose.yaml.
type composeFile struct {
	ports          map[string][]string // published ports
	health         map[string]string   // the healthcheck's test line
	volume         map[string]bool     // mounts the kubelet volume
	image, network map[string]string   // image, network_mode
}

// readCompose reads the services of the compose file at path, line by line
// (the file's own layout: two spaces a level), and fails t on any old
// gRPC listen address or port left in it.
func readCompose(t *testing.T, path string) composeFile {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c := composeFile{ports: map[string][]string{}, health: map[string]string{}, volume: map[string]bool{},
		image: map[string]string{}, network: map[string]string{}}
	var inServices bool
	var service, within string // the current service and its current key
	for _, line := range strings.Split(string(data), "\n") {
		if i := strings.Index(line, "#"); i >= 0 && !strings.Contains(line[:i], `"`) {
			line = line[:i]
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		indent := len(line) - len(strings.TrimLeft(line, " "))
		text := strings.TrimSpace(line)
		switch {
		case indent == 0:
			inServices = text == "services:"
			service = ""
		case !inServices:
		case indent == 2:
			service, within = strings.TrimSuffix(text, ":"), ""
		case indent == 4:
			key, value, _ := strings.Cut(text, ":")
			within, value = key, strings.Trim(strings.TrimSpace(value), `"'`)
			switch key {
			case "image":
				c.image[service] = value
			case "network_mode":
				c.network[service] = value
			}
		case within == "ports" && strings.HasPrefix(text, "- "):
			c.ports[service] = append(c.ports[service], strings.Trim(strings.TrimPrefix(text, "- "), `"'`))
		case within == "healthcheck" && strings.HasPrefix(text, "test:"):
			c.health[service] = text
		case within == "volumes" && text == "- kubelet:/var/lib/kubelet":
			c.volume[service] = true
		}
		if strings.Contains(text, "--listen ") || strings.Contains(text, "_LISTEN:") || strings.Contains(text, "5005") {
			t.Errorf("docker-compose.yaml still has an old gRPC listen address or port: %q", text)
		}
	}
	return c
}
