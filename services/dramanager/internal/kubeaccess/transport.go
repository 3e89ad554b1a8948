package kubeaccess

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// localHost is the placeholder host of the node-local API's client
// configuration; localTransport sends each request to the server its
// kubeconfig names.
const localHost = "nodeplug-apiserver.local"

// ErrNoLocalAPI is a request to the node-local resource API made while no
// kubeconfig for it exists.
var ErrNoLocalAPI = errors.New("the node-local resource API is not running")

// localTransport is the node-local API's transport. At each request it
// looks at the kubeconfig nodeplug-apiserver writes for the dramanager
// and, when the file is new or changed (another port, renewed
// certificates), builds the TLS transport it describes anew; the request
// goes to the server it names. So the dramanager starts, and its
// device-plugin half serves, whether or not nodeplug-apiserver has run
// yet, and follows it across restarts.
type localTransport struct {
	path string

	mu     sync.Mutex
	stamp  stamp
	rt     http.RoundTripper
	server *url.URL
}

// stamp tells whether the kubeconfig changed.
type stamp struct {
	mtime time.Time
	size  int64
	ino   uint64
}

var _ http.RoundTripper = (*localTransport)(nil)

// RoundTrip sends req to the server of the current kubeconfig.
func (t *localTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	rt, server, err := t.current()
	if err != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, err
	}
	out := req.Clone(req.Context())
	out.URL.Scheme, out.URL.Host, out.Host = server.Scheme, server.Host, ""
	resp, err := rt.RoundTrip(out)
	if err != nil {
		return nil, fmt.Errorf("the node-local resource API (nodeplug-apiserver) at %s: %w", server.Host, err)
	}
	return resp, nil
}

// current is the transport and server of the kubeconfig as it is now.
func (t *localTransport) current() (http.RoundTripper, *url.URL, error) {
	fi, err := os.Stat(t.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("%w: no kubeconfig at %s (nodeplug-apiserver writes it when it starts with the same --root-dir)", ErrNoLocalAPI, t.path)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("the node-local resource API's kubeconfig: %w", err)
	}
	st := stampOf(fi)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rt != nil && st == t.stamp {
		return t.rt, t.server, nil
	}
	rt, server, err := load(t.path)
	if err != nil {
		return nil, nil, err
	}
	// The old transport's idle connections, through client-go's wrappers
	// (a bearer token's, say).
	utilnet.CloseIdleConnectionsFor(t.rt)
	t.stamp, t.rt, t.server = st, rt, server
	return rt, server, nil
}

// load builds the transport a kubeconfig describes.
func load(path string) (http.RoundTripper, *url.URL, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, nil, fmt.Errorf("the node-local resource API's kubeconfig %s: %w", path, err)
	}
	server, err := url.Parse(cfg.Host)
	if err != nil || server.Host == "" {
		return nil, nil, fmt.Errorf("the node-local resource API's kubeconfig %s: server %q is not a URL", path, cfg.Host)
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("the node-local resource API's kubeconfig %s: %w", path, err)
	}
	return rt, server, nil
}
