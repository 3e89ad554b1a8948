package upstream

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nodeplug/nodeplug/internal/certs"
	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
)

// clusterBinEnv names the directory holding kube-apiserver and etcd, built
// from the Go module proxy at our k8s.io release by make test-cluster
// (tools/kube-apiserver, tools/etcd). Without it the cluster tests skip.
const clusterBinEnv = "NODEPLUG_CLUSTER_BIN"

// The identities of the cluster tests, as their client certificates name
// them: nodeplug's is in the group deploy/rbac/nodeplug.yaml binds, the
// driver's is the user deploy/rbac/example-dra-driver.yaml binds.
const (
	nodeplugGroup  = "nodeplug:dramanagers"
	driverIdentity = "example-dra-driver"
)

// controlPlane is a real Kubernetes control plane on loopback: etcd and
// kube-apiserver (RBAC alone authorizes, as in a cluster) with a PKI made
// by the test. The API server keeps its port across restarts, so the
// kubeconfigs written for it stay valid.
type controlPlane struct {
	t        *testing.T
	bin, dir string
	ca       *certs.CA
	etcdURL  string
	apiPort  int
	etcd     *proc
	api      *proc
	// admin is a clientset of system:masters.
	admin kubernetes.Interface
}

// proc is etcd or kube-apiserver: a process whose last output is kept.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *stack.Tail
	done chan struct{}
	err  error // once done is closed
}

func startProc(name, bin string, args []string) (*proc, error) {
	p := &proc{name: name, cmd: exec.Command(bin, args...), out: &stack.Tail{Max: 256 << 10}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exited reports the exit, once the process has ended.
func (p *proc) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited: %v", p.name, p.err)
	default:
		return nil
	}
}

// stopGrace bounds a graceful stop: kube-apiserver stops listening at
// once on SIGTERM, then may hold its open connections for up to a minute;
// past this it is killed.
const stopGrace = 5 * time.Second

// stop sends sig and waits for the exit, killing the process after
// stopGrace.
func (p *proc) stop(sig syscall.Signal) {
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(stopGrace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// startControlPlane starts etcd and kube-apiserver, waits until the API is
// ready with its bootstrap RBAC roles and the default namespace, and
// applies deploy/rbac; both stop when t ends (their output shown when it
// failed).
func startControlPlane(t *testing.T) *controlPlane {
	t.Helper()
	bin := os.Getenv(clusterBinEnv)
	if bin == "" {
		t.Skipf("%s is not set: make test-cluster builds kube-apiserver and etcd and runs the cluster tests", clusterBinEnv)
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			t.Fatalf("%s=%s: %v", clusterBinEnv, bin, err)
		}
	}
	cp := &controlPlane{t: t, bin: bin, dir: testutil.TempDir(t)}
	var err error
	if cp.ca, err = certs.NewCA("nodeplug cluster test CA"); err != nil {
		t.Fatal(err)
	}
	if err := certs.WriteFile(cp.path("ca.crt"), cp.ca.PEM); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.stop)
	cp.startEtcd()
	cp.writeAPIFiles()
	cp.startAPI()
	cs, err := kubernetes.NewForConfig(loadConfig(t, cp.kubeconfig(cp.dir, "admin", []string{"system:masters"})))
	if err != nil {
		t.Fatal(err)
	}
	cp.admin = cs
	cp.waitReady()
	cp.applyRBAC()
	return cp
}

func (cp *controlPlane) path(name string) string { return filepath.Join(cp.dir, name) }

// stop stops the API server and etcd, showing their output when the test
// failed.
func (cp *controlPlane) stop() {
	for _, p := range []*proc{cp.api, cp.etcd} {
		if p == nil {
			continue
		}
		p.stop(syscall.SIGTERM)
		if cp.t.Failed() {
			cp.t.Logf("%s output (last part):\n%s", p.name, p.out.String())
		}
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

// startEtcd starts etcd on two free loopback ports (clients, peers), with
// its data under the test's directory, trying other ports when one was
// taken meanwhile.
func (cp *controlPlane) startEtcd() {
	cp.t.Helper()
	for attempt := 0; ; attempt++ {
		client, peer := freePort(cp.t), freePort(cp.t)
		cp.etcdURL = "http://127.0.0.1:" + strconv.Itoa(client)
		peerURL := "http://127.0.0.1:" + strconv.Itoa(peer)
		p, err := startProc("etcd", filepath.Join(cp.bin, "etcd"), []string{
			"--data-dir", cp.path("etcd"),
			"--listen-client-urls", cp.etcdURL, "--advertise-client-urls", cp.etcdURL,
			"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
			"--initial-cluster", "default=" + peerURL,
			"--unsafe-no-fsync", "--log-level", "warn",
		})
		if err != nil {
			cp.t.Fatal(err)
		}
		err = waitFor(func() error {
			if err := p.exited(); err != nil {
				return err
			}
			return httpOK(http.DefaultClient, cp.etcdURL+"/health")
		})
		if err == nil {
			cp.etcd = p
			return
		}
		p.stop(syscall.SIGKILL)
		if attempt >= 3 {
			cp.t.Fatalf("etcd did not start: %v\n%s", err, p.out.String())
		}
		_ = os.RemoveAll(cp.path("etcd"))
	}
}

// afterRestart bounds the waits for clients to come back after the API
// server's restart: client-go's reflectors back off up to 30 s between
// attempts while it is away, and the driver's is one of them.
const afterRestart = 3 * time.Minute

// waitFor polls cond until it returns nil or testutil.Deadline passes.
func waitFor(cond func() error) error {
	deadline := time.Now().Add(testutil.Deadline)
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func httpOK(c *http.Client, url string) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

// writeAPIFiles writes the API server's serving certificate (for
// 127.0.0.1) and the service-account signing key, and picks its port.
func (cp *controlPlane) writeAPIFiles() {
	cp.t.Helper()
	if _, _, err := cp.ca.IssueFiles(cp.dir, certs.Spec{Name: "apiserver", Server: true, Hosts: []string{"127.0.0.1", "localhost"}}); err != nil {
		cp.t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		cp.t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		cp.t.Fatal(err)
	}
	if err := certs.WriteFile(cp.path("sa.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})); err != nil {
		cp.t.Fatal(err)
	}
	cp.apiPort = freePort(cp.t)
}

// startAPI starts kube-apiserver on its port and waits until it serves
// (not yet ready: waitReady).
func (cp *controlPlane) startAPI() {
	cp.t.Helper()
	p, err := startProc("kube-apiserver", filepath.Join(cp.bin, "kube-apiserver"), []string{
		"--etcd-servers", cp.etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(cp.apiPort),
		"--tls-cert-file", cp.path("apiserver.crt"), "--tls-private-key-file", cp.path("apiserver.key"),
		"--client-ca-file", cp.path("ca.crt"),
		"--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", cp.path("sa.key"),
		"--service-account-signing-key-file", cp.path("sa.key"),
		"--service-cluster-ip-range", "10.96.0.0/16",
		// The loopback address it advertises is not one a Service's
		// endpoints may hold.
		"--endpoint-reconciler-type", "none",
		"--cert-dir", cp.path("apiserver-certs"),
		"--v", "1",
	})
	if err != nil {
		cp.t.Fatal(err)
	}
	cp.api = p
	pool := x509.NewCertPool()
	pool.AddCert(cp.ca.Cert)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	if err := waitFor(func() error {
		if err := p.exited(); err != nil {
			return err
		}
		return httpOK(c, cp.url()+"/livez")
	}); err != nil {
		cp.t.Fatalf("kube-apiserver did not start: %v\n%s", err, p.out.String())
	}
}

func (cp *controlPlane) url() string { return "https://127.0.0.1:" + strconv.Itoa(cp.apiPort) }

// stopAPI stops the API server with sig (SIGTERM: a graceful stop; SIGKILL:
// a crash).
func (cp *controlPlane) stopAPI(sig syscall.Signal) { cp.api.stop(sig) }

// restartAPI stops the API server with sig and starts it again on the same
// port, waiting until it is ready.
func (cp *controlPlane) restartAPI(sig syscall.Signal) {
	cp.t.Helper()
	start := time.Now()
	cp.stopAPI(sig)
	cp.t.Logf("kube-apiserver stopped (%v) in %s", sig, time.Since(start).Round(time.Millisecond))
	cp.startAPI()
	cp.waitReady()
}

// waitReady waits until /readyz passes (the bootstrap RBAC roles are among
// its checks) and the default namespace exists.
func (cp *controlPlane) waitReady() {
	cp.t.Helper()
	rc := cp.admin.Discovery().RESTClient()
	testutil.Eventually(cp.t, "kube-apiserver ready", func() error {
		if err := cp.api.exited(); err != nil {
			return fmt.Errorf("%w\n%s", err, cp.api.out.String())
		}
		if body, err := rc.Get().AbsPath("/readyz").DoRaw(ctxT(cp.t)); err != nil {
			return fmt.Errorf("readyz: %v: %s", err, body)
		}
		_, err := cp.admin.CoreV1().Namespaces().Get(ctxT(cp.t), metav1.NamespaceDefault, metav1.GetOptions{})
		return err
	})
}

// kubeconfig issues a client certificate named name in groups and writes a
// kubeconfig for it into dir, returning its path.
func (cp *controlPlane) kubeconfig(dir, name string, groups []string) string {
	cp.t.Helper()
	file := filepath.Join(dir, "kubeconfig-"+sanitize(name))
	crt, key, err := cp.ca.Issue(certs.Spec{Name: name, Orgs: groups})
	if err != nil {
		cp.t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: cp.url(), CertificateAuthorityData: cp.ca.PEM}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificateData: crt, ClientKeyData: key}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: name}
	cfg.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*cfg, file); err != nil {
		cp.t.Fatal(err)
	}
	return file
}

func sanitize(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return '_'
	}, name)
}

func loadConfig(t *testing.T, path string) *rest.Config {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// applyRBAC creates, as the admin, every ClusterRole and ClusterRoleBinding
// of deploy/rbac: the permissions the tests' identities then have are those
// the manifests give, nothing more.
func (cp *controlPlane) applyRBAC() {
	cp.t.Helper()
	root, err := stack.ModuleRoot()
	if err != nil {
		cp.t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "deploy", "rbac", "*.yaml"))
	if err != nil || len(files) == 0 {
		cp.t.Fatalf("no manifests in deploy/rbac (%v)", err)
	}
	applied := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			cp.t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var raw map[string]any
			if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				cp.t.Fatalf("%s: %v", f, err)
			}
			if len(raw) == 0 {
				continue
			}
			applied++
			cp.create(f, raw)
		}
	}
	if applied == 0 {
		cp.t.Fatal("deploy/rbac holds no objects")
	}
}

// create creates one decoded manifest object: a ClusterRole, a
// ClusterRoleBinding, a Role or a RoleBinding.
func (cp *controlPlane) create(file string, raw map[string]any) {
	cp.t.Helper()
	data, err := json.Marshal(raw)
	if err != nil {
		cp.t.Fatal(err)
	}
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		cp.t.Fatalf("%s: %v", file, err)
	}
	ctx := ctxT(cp.t)
	rbac := cp.admin.RbacV1()
	switch o := obj.(type) {
	case *rbacv1.ClusterRole:
		_, err = rbac.ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
	case *rbacv1.ClusterRoleBinding:
		_, err = rbac.ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
	case *rbacv1.Role:
		_, err = rbac.Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	case *rbacv1.RoleBinding:
		_, err = rbac.RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	default:
		cp.t.Fatalf("%s: %T is not an RBAC object", file, obj)
	}
	if err != nil {
		cp.t.Fatalf("%s: create %T: %v", file, obj, err)
	}
}

// createNode creates the Node object a kubelet would register for name
// (drivers own their slices through it).
func (cp *controlPlane) createNode(name string) *corev1.Node {
	cp.t.Helper()
	n, err := cp.admin.CoreV1().Nodes().Create(ctxT(cp.t), &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: name, Labels: map[string]string{corev1.LabelHostname: name},
	}}, metav1.CreateOptions{})
	if err != nil {
		cp.t.Fatalf("create Node %s: %v", name, err)
	}
	return n
}

// compactEtcd compacts etcd's history up to its current revision: a watch
// resumed from before that gets 410 Gone (with the API server's watch
// cache off, from etcd itself).
func (cp *controlPlane) compactEtcd(ctx context.Context) error {
	// etcd's JSON gateway: a range read gives the current revision.
	var rng struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	if err := cp.etcdPost(ctx, "/v3/kv/range", map[string]string{"key": base64.StdEncoding.EncodeToString([]byte("/"))}, &rng); err != nil {
		return err
	}
	if rng.Header.Revision == "" {
		return errors.New("etcd's range answer has no revision")
	}
	return cp.etcdPost(ctx, "/v3/kv/compaction", map[string]any{"revision": rng.Header.Revision, "physical": true}, nil)
}

func (cp *controlPlane) etcdPost(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cp.etcdURL+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s: %s", path, resp.Status, strings.TrimSpace(string(data)))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}
