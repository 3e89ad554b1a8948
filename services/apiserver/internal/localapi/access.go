// Package localapi is the node-local resource API with everything it
// needs to be served: its store (package resourceapi), a CA and
// certificates under <root>/nodeplug/pki/, a kubeconfig per identity under
// <root>/nodeplug/ (the drivers', the operator's, the reader's and the
// devicemanager's), and its loopback listener. nodeplug-apiserver serves
// it; the devicemanager and the drivers reach it through the kubeconfigs,
// as they would reach a cluster's API server.
package localapi

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/nodename"
	"github.com/nodeplug/nodeplug/services/apiserver/internal/resourceapi"
)

// DefaultListen is the node-local API's address (nodeplug-apiserver --resource-api-listen).
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
	// Listen is the node-local API's address (loopback only).
	Listen string
	// NodeName is the one Node (default: the host name).
	NodeName   string
	Log        *slog.Logger
	Registerer prometheus.Registerer
	// Limits bound the memory of its watches (zero fields: the defaults
	// of resourceapi.Limits).
	Limits resourceapi.Limits
	// BookmarkInterval: 0 means resourceapi.DefaultBookmarkInterval.
	BookmarkInterval time.Duration
}

// Access is the node-local API, ready to be served, and a client of it.
type Access struct {
	// Client reaches the API with the devicemanager's (internal)
	// certificate.
	Client kubernetes.Interface
	// Config is Client's configuration.
	Config *rest.Config
	// NodeName is the one Node the API serves.
	NodeName string
	// Local is the server; Serve runs it.
	Local *resourceapi.Server
	// Addr is the address the node-local API listens on.
	Addr string

	lis   net.Listener
	store *resourceapi.Store
	pki   *PKI
}

// Open sets up the node-local API: its store, the credentials, the
// kubeconfigs and the listener (served by Serve). Errors name the flag or
// file.
func Open(opts Options) (*Access, error) {
	node, err := nodename.Resolve(opts.NodeName)
	if err != nil {
		return nil, err
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

// openLocal opens what Open checked the options of; on an error it closes
// what it opened.
func openLocal(opts Options, host, node string) (_ *Access, err error) {
	pki, err := EnsurePKI(layout.PKIDir(opts.RootDir), hostsFor(host))
	if err != nil {
		return nil, err
	}
	store, err := resourceapi.OpenStore(layout.ResourceStoreFile(opts.RootDir), opts.Limits)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = store.Close()
		}
	}()
	srv, err := resourceapi.NewServer(resourceapi.Config{Store: store, NodeName: node, Log: opts.Log, Registerer: opts.Registerer,
		BookmarkInterval: opts.BookmarkInterval,
	})
	if err != nil {
		return nil, err
	}
	lis, err := listen(opts.Listen, KubeconfigPath(opts.RootDir, Driver))
	if err != nil {
		return nil, fmt.Errorf("--resource-api-listen %s: %w", opts.Listen, err)
	}
	defer func() {
		if err != nil {
			_ = lis.Close()
		}
	}()
	server := "https://" + lis.Addr().String()
	for _, id := range Identities {
		if err := WriteKubeconfig(KubeconfigPath(opts.RootDir, id), server, pki, id); err != nil {
			return nil, err
		}
	}
	cfg, err := RESTConfig(server, pki, Internal)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", cfg.Host, err)
	}
	return &Access{Client: client, Config: cfg, NodeName: node, Local: srv, Addr: lis.Addr().String(),
		lis: lis, store: store, pki: pki}, nil
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

// Serve serves the node-local API until ctx ends, then closes its store.
func (a *Access) Serve(ctx context.Context) error {
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
		UserAgent: "nodeplug-dramanager",
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
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	return WriteFileAtomic(path, data, 0o600)
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
