// Package kubeaccess gives the devicemanager its Kubernetes API: a
// cluster's, named by --kubeconfig, or, by default, the node-local
// resource API (package resourceapi) it serves itself, with the
// credentials that API needs — a CA and certificates under
// <root>/nodeplug/pki/ and a kubeconfig per role under <root>/nodeplug/.
// Either way the rest of the devicemanager gets a client-go
// kubernetes.Interface and the node name.
package kubeaccess

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/resourceapi"
)

// DefaultListen is the node-local API's address (--resource-api-listen).
const DefaultListen = "127.0.0.1:6446"

// KubeconfigPath is an identity's kubeconfig: layout.KubeconfigFile for
// drivers, layout.IdentityKubeconfigFile for the others.
func KubeconfigPath(root string, id Identity) string {
	if id == Driver {
		return layout.KubeconfigFile(root)
	}
	return layout.IdentityKubeconfigFile(root, id.Name)
}

// Options configures Open.
type Options struct {
	RootDir string
	// Kubeconfig, when set, names the API server to use; nothing is served.
	Kubeconfig string
	// Listen is the node-local API's address (loopback only).
	Listen string
	// NodeName is the one Node (default: the host name).
	NodeName   string
	Log        *slog.Logger
	Registerer prometheus.Registerer
	// History and BookmarkInterval tune the node-local API (0: its
	// defaults, resourceapi.DefaultHistory and DefaultBookmarkInterval).
	History          int
	BookmarkInterval time.Duration
}

// Access is the API the devicemanager uses.
type Access struct {
	// Client reaches the API: the node-local one with the devicemanager's
	// own (internal) certificate, or the cluster's.
	Client kubernetes.Interface
	// Config is Client's configuration.
	Config *rest.Config
	// NodeName is the node whose slices and claims are handled here.
	NodeName string
	// Local is the node-local server (nil with a kubeconfig); Serve runs it.
	Local *resourceapi.Server
	// Addr is the address the node-local API listens on.
	Addr string

	lis   net.Listener
	store *resourceapi.Store
	pki   *PKI
}

// Open sets up the API: with a kubeconfig, a client for that server;
// otherwise the store, the credentials, the kubeconfigs and the listener of
// the node-local API (served by Serve). Errors name the flag or file.
func Open(opts Options) (*Access, error) {
	node, err := nodeName(opts.NodeName)
	if err != nil {
		return nil, err
	}
	if opts.Kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", opts.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig %s: %w", opts.Kubeconfig, err)
		}
		return newAccess(cfg, node)
	}
	if opts.Listen == "" {
		opts.Listen = DefaultListen
	}
	host, _, err := net.SplitHostPort(opts.Listen)
	if err != nil {
		return nil, fmt.Errorf("--resource-api-listen %q: %w", opts.Listen, err)
	}
	if !isLoopback(host) {
		return nil, fmt.Errorf("--resource-api-listen %q: the node-local resource API serves on loopback only", opts.Listen)
	}
	return openLocal(opts, host, node)
}

func openLocal(opts Options, host, node string) (*Access, error) {
	pki, err := EnsurePKI(layout.PKIDir(opts.RootDir), hostsFor(host))
	if err != nil {
		return nil, err
	}
	store, err := resourceapi.OpenStore(layout.ResourceStoreFile(opts.RootDir), opts.History)
	if err != nil {
		return nil, err
	}
	srv, err := resourceapi.NewServer(resourceapi.Config{Store: store, NodeName: node, Log: opts.Log, Registerer: opts.Registerer,
		BookmarkInterval: opts.BookmarkInterval,
	})
	if err != nil {
		_ = store.Close()
		return nil, err
	}
	lis, err := listen(opts.Listen, KubeconfigPath(opts.RootDir, Driver))
	if err != nil {
		_ = store.Close()
		return nil, fmt.Errorf("--resource-api-listen %s: %w", opts.Listen, err)
	}
	server := "https://" + lis.Addr().String()
	for _, id := range Identities {
		if err := WriteKubeconfig(KubeconfigPath(opts.RootDir, id), server, pki, id); err != nil {
			_ = lis.Close()
			_ = store.Close()
			return nil, err
		}
	}
	cfg, err := RESTConfig(server, pki, Internal)
	if err != nil {
		_ = lis.Close()
		_ = store.Close()
		return nil, err
	}
	a, err := newAccess(cfg, node)
	if err != nil {
		_ = lis.Close()
		_ = store.Close()
		return nil, err
	}
	a.Local, a.lis, a.store, a.pki, a.Addr = srv, lis, store, pki, lis.Addr().String()
	return a, nil
}

// listen binds addr. Port 0 picks a free port at first start and, on a
// later start of the same root dir, the port the kubeconfigs already name
// when it is free, so that clients holding them keep working.
func listen(addr, kubeconfig string) (net.Listener, error) {
	host, port, _ := net.SplitHostPort(addr)
	if port == "0" {
		if cfg, err := clientcmd.LoadFromFile(kubeconfig); err == nil && cfg.Clusters["nodeplug"] != nil {
			if u, err := url.Parse(cfg.Clusters["nodeplug"].Server); err == nil && u.Hostname() == host {
				if lis, err := net.Listen("tcp", u.Host); err == nil {
					return lis, nil
				}
			}
		}
	}
	return net.Listen("tcp", addr)
}

func newAccess(cfg *rest.Config, node string) (*Access, error) {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", cfg.Host, err)
	}
	return &Access{Client: client, Config: cfg, NodeName: node}, nil
}

// Serve serves the node-local API until ctx ends, then closes its store.
// With a kubeconfig there is nothing to serve: it returns when ctx ends.
func (a *Access) Serve(ctx context.Context) error {
	if a.Local == nil {
		<-ctx.Done()
		return nil
	}
	tlsCfg, err := a.pki.ServerTLS()
	if err != nil {
		return err
	}
	err = a.Local.Serve(ctx, a.lis, tlsCfg)
	if cerr := a.store.Close(); err == nil {
		err = cerr
	}
	return err
}

// RESTConfig is a client configuration for the node-local API at url with
// id's certificate.
func RESTConfig(url string, pki *PKI, id Identity) (*rest.Config, error) {
	certPEM, keyPEM, err := pki.ClientPEM(id)
	if err != nil {
		return nil, fmt.Errorf("the %s certificate: %w", id.Name, err)
	}
	return &rest.Config{
		Host: url,
		TLSClientConfig: rest.TLSClientConfig{
			CAData: pki.CAPEM, CertData: certPEM, KeyData: keyPEM,
		},
		UserAgent: "nodeplug-devicemanager",
		QPS:       -1,
	}, nil
}

// WriteKubeconfig writes (0600, atomically) a kubeconfig for the API at
// url with id's certificate and key embedded, so it works on its own.
func WriteKubeconfig(path, url string, pki *PKI, id Identity) error {
	certPEM, keyPEM, err := pki.ClientPEM(id)
	if err != nil {
		return fmt.Errorf("the %s certificate: %w", id.Name, err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["nodeplug"] = &clientcmdapi.Cluster{Server: url, CertificateAuthorityData: pki.CAPEM}
	cfg.AuthInfos[id.User] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts["nodeplug"] = &clientcmdapi.Context{Cluster: "nodeplug", AuthInfo: id.User}
	cfg.CurrentContext = "nodeplug"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	if old, err := os.ReadFile(path); err == nil && string(old) == string(data) {
		return nil
	}
	return WriteFileAtomic(path, data, 0o600)
}

// nodeName is the flag's value or the host name, which must be a valid
// Node name.
func nodeName(name string) (string, error) {
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("--node-name not set and the host name is unknown: %w", err)
		}
		name = strings.ToLower(h)
	}
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return "", fmt.Errorf("--node-name %q is not a valid Node name: %s", name, strings.Join(msgs, "; "))
	}
	return name, nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// hostsFor is the server certificate's names: loopback, and the host of
// the listen address.
func hostsFor(host string) []string {
	hosts := []string{"127.0.0.1", "::1", "localhost"}
	for _, h := range hosts {
		if h == host {
			return hosts
		}
	}
	return append(hosts, host)
}
