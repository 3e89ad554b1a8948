package e2e

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	resourcev1 "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/layout"
)

var screenshotDir = flag.String("screenshots", "", "directory for the console test's screenshots (default: the test's artifact directory, kept with go test -artifacts)")

// chromium returns the path of a Chromium to drive, or "" when none is
// installed.
func chromium() string {
	if p := os.Getenv("NODEPLUG_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-headless-shell", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// consoleInfo is what nodeplug-console leaves in <root>/nodeplug/console.json.
type consoleInfo struct {
	URL, Token, OTLP string
}

// startConsole starts nodeplug-console over root on free ports (building
// it when TestMain did not) and waits for its info file.
func startConsole(t *testing.T, root string) consoleInfo {
	t.Helper()
	dir := binDir
	if _, err := os.Stat(filepath.Join(dir, "nodeplug-console")); err != nil {
		dir = testutil.TempDir(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if err := stack.Build(ctx, dir, "nodeplug-console"); err != nil {
			t.Fatal(err)
		}
	}
	p, err := stack.Start(filepath.Join(dir, "nodeplug-console"),
		[]string{"--root-dir", root, "--listen", "127.0.0.1:0", "--otlp-listen", "127.0.0.1:0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("nodeplug-console log:\n%s", p.Logs())
		}
	})
	var info consoleInfo
	testutil.Eventually(t, "the console's info file", func() error {
		if err := p.Err(); err != nil {
			return fmt.Errorf("nodeplug-console exited: %v\n%s", err, p.Logs())
		}
		data, err := os.ReadFile(layout.ConsoleInfoFile(root))
		if err != nil {
			return err
		}
		return json.Unmarshal(data, &info)
	})
	if fi, err := os.Stat(layout.ConsoleInfoFile(root)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the console's info file: %v, mode %v; want 0600", err, fi.Mode())
	}
	return info
}

// TestConsoleInBrowser drives the console in headless Chromium against the
// real stack, with the services exporting their spans to the console's own
// OTLP receiver (as under make run): the sample plugin shows as registered;
// a health flip changes its device's cell without a reload; an allocation
// appears; the registration's trace has spans from all three services and
// a span's attributes show on selection, from the keyboard too, under a
// time ruler; the plugins table shows paths relative to the root dir and
// generations as when the socket was made; the trace list filters by
// service, operation, minimum duration and status and finds a trace by its
// ID's prefix or a resource name, the filter in the URL, and holds no trace
// of nodeplugctl's reads; nodeplugctl
// trace reads the same trace from the console; a DRA driver (the upstream
// kubeletplugin helper, pointed at the node-local API with the driver
// kubeconfig) shows connected and the devices it publishes appear without
// a reload; a request without the token, with a foreign Host header or of
// another method is refused.
func TestConsoleInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("drives a browser against the whole stack")
	}
	browser := chromium()
	if browser == "" {
		t.Skip("no Chromium on PATH (Debian: apt-get install chromium; or set NODEPLUG_CHROMIUM): the console's browser test needs one")
	}
	shots := *screenshotDir
	if shots == "" {
		shots = t.ArtifactDir()
	}
	root := testutil.TempDir(t)
	info := startConsole(t, root)

	st := stack.NewProcesses(binDir, root, "OTEL_EXPORTER_OTLP_ENDPOINT=http://"+info.OTLP, "OTEL_EXPORTER_OTLP_INSECURE=true", "OTEL_BSP_SCHEDULE_DELAY=100")
	t.Cleanup(func() {
		st.StopAll()
		if t.Failed() {
			for _, s := range stack.Services {
				if p := st.Process(s); p != nil {
					t.Logf("%s log:\n%s", s, p.Logs())
				}
			}
		}
	})
	sctx, scancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer scancel()
	if err := st.StartAll(sctx); err != nil {
		t.Fatal(err)
	}
	plugin, err := stack.Start(filepath.Join(binDir, "nodeplug-sampleplugin"),
		[]string{"--root-dir", root, "--mode", "plugins-registry", "--resource", "example.com/sample", "--devices", "4"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plugin.Stop(10 * time.Second) })

	checkRefusals(t, info)

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.WindowSize(1360, 900))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium's sandbox refuses to run as root
	}
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer acancel()
	errs := &pageErrors{}
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithListener(errs.listen))
	defer cancel()
	if err := chromedp.Do(ctx); err != nil { // starts the browser, bound to ctx
		t.Fatalf("starting %s: %v", browser, err)
	}
	b := &browserTab{t: t, ctx: ctx, shots: shots}

	// Without the token: refused, in the browser as for any client.
	b.do("open the console without the token", chromedp.Navigate(info.URL+"/plugins"))
	if body := b.text("body"); !strings.Contains(body, "unauthorized") {
		t.Fatalf("without the token the console answered %q", body)
	}

	// The URL printed at start: the token becomes a cookie, the view
	// shows the sample plugin registered.
	b.do("open the console's URL", chromedp.Navigate(info.URL+"/?token="+info.Token))
	b.wait("the sample plugin registered", `tr[data-name="example.com/sample"][data-state="registered"]`)
	if loc := b.eval(`location.search`); loc != "" {
		t.Errorf("the token stayed in the URL: %q", loc)
	}
	errs.start() // the refusal above is the only error a page may show
	b.wait("every service synced", `ul.services:not(:has(li.down))`)
	checkPluginsTable(t, b, root)
	b.shot("console-plugins.png")

	// A health flip (SIGUSR1: the sample plugin marks dev-0 unhealthy)
	// changes that cell without a reload.
	b.do("open resources", chromedp.Navigate(info.URL+"/resources"))
	dev0 := `li[data-resource="example.com/sample"][data-device="dev-0"]`
	b.wait("dev-0 healthy", dev0+`[data-state="healthy"]`)
	b.markPage()
	if err := plugin.Cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	b.wait("dev-0 unhealthy", dev0+`[data-state="unhealthy"]`)
	if label := b.text(dev0 + ` .dev-label`); label != "unhealthy" {
		t.Errorf("dev-0's label %q, want the text \"unhealthy\"", label)
	}
	b.checkNoReload("the health flip")

	// An allocation appears, with its devices and a trace link.
	b.do("open allocations", chromedp.Navigate(info.URL+"/allocations"))
	b.wait("the empty allocation view", `#live p.empty`)
	b.markPage()
	out, err := exec.Command(filepath.Join(binDir, "nodeplugctl"), "--root-dir", root,
		"allocate", "--pod", "pod-1", "--container", "main", "--namespace", "default", "--name", "web-0", "example.com/sample=2").CombinedOutput()
	if err != nil {
		t.Fatalf("nodeplugctl allocate: %v\n%s", err, out)
	}
	row := `tr[data-pod="pod-1"][data-container="main"][data-resource="example.com/sample"]`
	b.wait("the allocation", row+` li[data-state="allocated"]`)
	b.wait("the allocation's trace link", row+` a[href^="/traces/"]`)
	allocTrace := strings.TrimPrefix(b.eval(`document.querySelector('`+row+` a[href^="/traces/"]').getAttribute('href')`), "/traces/")
	b.checkNoReload("the allocation")
	b.shot("console-allocations.png")

	// The resource's grid now shows all three states, each in words.
	b.do("open resources again", chromedp.Navigate(info.URL+"/resources"))
	b.wait("allocated devices in the grid", `li[data-resource="example.com/sample"][data-state="allocated"]`)
	if n := b.eval(`String(document.querySelectorAll('li[data-resource="example.com/sample"] .dev-label').length)`); n != "4" {
		t.Errorf("%s device cells with a text label, want 4", n)
	}
	b.shot("console-resources.png")

	// The registration's trace: the plugin's trace link leads to a
	// waterfall with spans of all three services.
	b.do("open plugins", chromedp.Navigate(info.URL+"/plugins"))
	link := `tr[data-name="example.com/sample"] a[href^="/traces/"]`
	b.wait("the plugin's trace link", link)
	href := b.eval(`document.querySelector('` + link + `').getAttribute('href')`)
	b.doLive("follow the trace link", chromedp.Click(chromedp.CSS(link)))
	for _, svc := range []string{"nodeplug-watcher", "nodeplug-reconciler", "nodeplug-devicemanager"} {
		b.wait("a span of "+svc, `button.span[data-service="`+svc+`"]`)
	}
	b.wait("the devicemanager's RegisterPlugin span", `button.span[data-service="nodeplug-devicemanager"]`)
	// From the keyboard: focus the first span, move down with the arrow
	// key, open it with Enter.
	first := `ol.waterfall li:first-child button.span`
	b.doLive("focus the first span", chromedp.Focus(chromedp.CSS(first)))
	b.doLive("arrow down", chromedp.SendKeys(chromedp.CSS(first), kb.ArrowDown))
	second := b.eval(`document.activeElement.dataset.span || ''`)
	if second == "" || second == b.eval(`document.querySelector('`+first+`').dataset.span`) {
		t.Fatalf("the arrow key did not move to the next span (focused %q)", second)
	}
	b.doLive("Enter on the second span", chromedp.SendKeys(chromedp.CSS(`#span-`+second), kb.Enter))
	b.wait("its attributes", `#attrs-`+second+`:not([hidden])`)
	// With the mouse: a devicemanager span, whose attributes name the
	// service.
	dmSpan := `button.span[data-service="nodeplug-devicemanager"]`
	id := b.eval(`document.querySelector('` + dmSpan + `').dataset.span`)
	b.doLive("select a devicemanager span", chromedp.Click(chromedp.CSS(`#span-`+id)))
	b.wait("the devicemanager span's attributes", `#attrs-`+id+`:not([hidden])`)
	if txt := b.text(`#attrs-` + id); !strings.Contains(txt, "nodeplug-devicemanager") {
		t.Errorf("the selected span's attributes do not name its service: %q", txt)
	}
	if b.eval(`document.querySelector('#attrs-`+second+`').hidden ? 'hidden' : 'shown'`) != "hidden" {
		t.Error("the previous selection's attributes are still shown")
	}
	checkRuler(t, b)
	b.shot("console-trace.png")

	// The trace list has it too.
	b.do("open traces", chromedp.Navigate(info.URL+"/traces"))
	b.wait("the registration trace in the list", `#traces a[href="`+href+`"]`)
	// The console's own reads (ListAllocations after each change, its
	// Watch streams) leave no trace of their own: its calls say "not
	// sampled".
	if roots := b.eval(`Array.from(document.querySelectorAll('#traces tbody tr td:nth-child(2)')).map(td => td.textContent).join('\n')`); strings.Contains(roots, "ListAllocations") {
		t.Errorf("the console's own ListAllocations calls made traces:\n%s", roots)
	}
	checkTraceTable(t, b, strings.TrimPrefix(href, "/traces/"))
	b.shot("console-traces.png")

	// nodeplugctl's reads leave no trace; the list's filter and search
	// find what they are asked for.
	checkNoReadTraces(t, info, root)
	checkTraceFilter(t, b, info, strings.TrimPrefix(href, "/traces/"), allocTrace)
	errs.check(t, "on the plugins, resources, allocations and traces pages")

	// nodeplugctl trace reads the same trace from the console, finding it
	// through the info file under the root dir.
	traceID := strings.TrimPrefix(href, "/traces/")
	out, err = exec.Command(filepath.Join(binDir, "nodeplugctl"), "--root-dir", root, "trace", traceID).CombinedOutput()
	if err != nil {
		t.Fatalf("nodeplugctl trace %s: %v\n%s", traceID, err, out)
	}
	if !strings.Contains(string(out), "3 services") || !strings.Contains(string(out), "watcher.socket_created") {
		t.Errorf("nodeplugctl trace %s from the console:\n%s", traceID, out)
	}

	checkDRAView(t, b, info, root)
	errs.check(t, "on the DRA page")
}

// consoleDRADriver is the DRA driver of the console test: it registers and
// publishes; no claim is ever sent to it.
type consoleDRADriver struct{}

func (consoleDRADriver) PrepareResourceClaims(context.Context, []*resourcev1.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	return nil, fmt.Errorf("the console test's driver prepares no claims")
}

func (consoleDRADriver) UnprepareResourceClaims(context.Context, []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	return nil, fmt.Errorf("the console test's driver prepares no claims")
}

func (consoleDRADriver) HandleError(context.Context, error, string) {}

func (consoleDRADriver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// checkDRAView starts a DRA driver on the upstream kubeletplugin helper
// (in this process, with the driver kubeconfig nodeplug-apiserver writes,
// registering through plugins_registry/ as any driver does) and follows
// it in the DRA view: the driver and its connected instance appear, a
// device it publishes appears with its attributes and capacity, and a
// second device published later appears too, without a reload.
func checkDRAView(t *testing.T, b *browserTab, info consoleInfo, root string) {
	t.Helper()
	b.do("open DRA", chromedp.Navigate(info.URL+"/dra"))
	b.wait("the DRA view synced", `ul.services:not(:has(li.down))`)
	b.markPage()

	client := func(file string) kubernetes.Interface {
		cfg, err := clientcmd.BuildConfigFromFlags("", file)
		if err != nil {
			t.Fatalf("kubeconfig %s: %v", file, err)
		}
		c, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	driverClient := client(layout.KubeconfigFile(root))
	var node string
	testutil.Eventually(t, "the node-local API's Node", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		nodes, err := client(layout.IdentityKubeconfigFile(root, "reader")).CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(nodes.Items) != 1 {
			return fmt.Errorf("%d nodes, want 1", len(nodes.Items))
		}
		node = nodes.Items[0].Name
		return nil
	})
	const name = "gpu.console.nodeplug.test"
	dataDir := filepath.Join(root, "plugins", name)
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		t.Fatal(err)
	}
	helper, err := kubeletplugin.Start(context.Background(), consoleDRADriver{},
		kubeletplugin.DriverName(name), kubeletplugin.NodeName(node), kubeletplugin.KubeClient(driverClient),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(root, layout.PluginsRegistryDirName)),
		kubeletplugin.PluginDataDirectoryPath(dataDir))
	if err != nil {
		t.Fatalf("start the DRA driver %s: %v", name, err)
	}
	t.Cleanup(helper.Stop)
	publish := func(n int) {
		t.Helper()
		devs := make([]resourcev1.Device, n)
		for i := range devs {
			devs[i] = resourcev1.Device{
				Name: fmt.Sprintf("gpu-%d", i),
				Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
					"model": {StringValue: ptr.To("console-m1")}, "index": {IntValue: ptr.To(int64(i))},
				},
				Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{"memory": {Value: apiresource.MustParse("16Gi")}},
			}
		}
		if err := helper.PublishResources(context.Background(), resourceslice.DriverResources{
			Pools: map[string]resourceslice.Pool{node: {Slices: []resourceslice.Slice{{Devices: devs}}}},
		}); err != nil {
			t.Fatalf("publish the resources of %s: %v", name, err)
		}
	}
	publish(1)

	drv := `section[data-driver="` + name + `"]`
	b.wait("the driver's connected, serving instance", drv+` tr[data-connected="true"][data-serving="true"]`)
	dev := func(d string) string {
		return `tr.slice-device[data-driver="` + name + `"][data-pool="` + node + `"][data-device="` + d + `"]`
	}
	b.wait("the published device", dev("gpu-0"))
	if txt := b.text(dev("gpu-0")); !strings.Contains(txt, "model=console-m1") || !strings.Contains(txt, "memory=16Gi") {
		t.Errorf("gpu-0's row lacks its attribute or capacity: %q", txt)
	}
	publish(2)
	b.wait("the second device, published later", dev("gpu-1"))
	b.checkNoReload("the published devices")
	b.shot("console-dra.png")
}

// checkRefusals: no token, a foreign Host (DNS rebinding), a method that is
// not GET or HEAD, each refused; the token alone lets a client in.
func checkRefusals(t *testing.T, info consoleInfo) {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range []struct {
		name, method, host string
		token              bool
		want               int
	}{
		{"the token", "GET", "", true, http.StatusOK},
		{"no token", "GET", "", false, http.StatusUnauthorized},
		{"a foreign Host header", "GET", "rebound.attacker.example", true, http.StatusForbidden},
		{"POST", "POST", "", true, http.StatusMethodNotAllowed},
	} {
		req, err := http.NewRequest(tc.method, info.URL+"/plugins", nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.host != "" {
			req.Host = tc.host
		}
		if tc.token {
			req.Header.Set("Authorization", "Bearer "+info.Token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, resp.StatusCode, tc.want)
		}
	}
}

// browserTab runs steps in one tab and fails the test with the page's
// content when one does not come true.
type browserTab struct {
	t     *testing.T
	ctx   context.Context
	shots string
}

func (b *browserTab) do(what string, a chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, testutil.Deadline)
	defer cancel()
	if err := chromedp.Do(ctx, a); err != nil {
		b.t.Fatalf("%s: %v\npage:\n%s", what, err, b.html())
	}
}

// doLive runs an action on an element of the live view. An update may
// replace the element between the action's finding it and acting on it;
// then the action, which did nothing yet, runs again on the new one.
func (b *browserTab) doLive(what string, a chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	deadline := time.Now().Add(testutil.Deadline)
	for {
		ctx, cancel := context.WithTimeout(b.ctx, testutil.Deadline)
		err := chromedp.Do(ctx, a)
		cancel()
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "Could not find node with given id") || time.Now().After(deadline) {
			b.t.Fatalf("%s: %v\npage:\n%s", what, err, b.html())
		}
	}
}

// wait waits until an element matching sel is visible.
func (b *browserTab) wait(what, sel string) {
	b.t.Helper()
	b.do("waiting for "+what+" ("+sel+")", chromedp.WaitVisible(chromedp.CSS(sel)))
}

func (b *browserTab) eval(expr string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, testutil.Deadline)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		b.t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

func (b *browserTab) text(sel string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, testutil.Deadline)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		b.t.Fatalf("reading %s: %v\npage:\n%s", sel, err, b.html())
	}
	return strings.TrimSpace(v)
}

// markPage leaves a mark in the page's window: a reload would lose it.
func (b *browserTab) markPage() { b.eval(`window.noReload = 'kept'; 'ok'`) }

func (b *browserTab) checkNoReload(what string) {
	b.t.Helper()
	if b.eval(`window.noReload || 'lost'`) != "kept" {
		b.t.Errorf("the page reloaded for %s: it should update in place", what)
	}
}

func (b *browserTab) html() string {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.documentElement.outerHTML`))
	if err != nil {
		return "(cannot read the page: " + err.Error() + ")"
	}
	return v
}

// shot saves a PNG of the page's content.
func (b *browserTab) shot(name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, testutil.Deadline)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.CSS("body")))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.MkdirAll(b.shots, 0o755); err != nil {
		b.t.Fatal(err)
	}
	path := filepath.Join(b.shots, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot: %s", path)
}
