// Package apiservertest serves the node-local resource API inside a
// test's process, exactly as nodeplug-apiserver serves it (the same store,
// credentials, kubeconfigs and HTTPS server), for the tests of the
// devicemanager's DRA parts that need a real API server but not a process
// of it. Tests of the processes start bin/nodeplug-apiserver instead.
package apiservertest

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeplug/nodeplug/services/apiserver/internal/localapi"
)

// Server is a running node-local resource API.
type Server struct {
	Root     string
	NodeName string
	// Addr is the loopback address it serves on.
	Addr string
	// Config and Client carry the devicemanager's (internal) identity, as
	// the kubeconfig nodeplug-apiserver writes for it.
	Config *rest.Config
	Client kubernetes.Interface
	// Metrics is the registry its metrics are on.
	Metrics *prometheus.Registry

	stop func()
}

// Start serves the node-local resource API of root for node on a free
// loopback port until the test ends (or Stop).
func Start(t testing.TB, root, node string) *Server {
	t.Helper()
	reg := prometheus.NewRegistry()
	a, err := localapi.Open(localapi.Options{RootDir: root, Listen: "127.0.0.1:0", NodeName: node, Registerer: reg})
	if err != nil {
		t.Fatalf("open the node-local resource API: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx) }()
	stopped := false
	s := &Server{Root: root, NodeName: a.NodeName, Addr: a.Addr, Config: a.Config, Client: a.Client, Metrics: reg}
	s.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the node-local resource API: %v", err)
		}
	}
	t.Cleanup(s.stop)
	return s
}

// Stop ends the server and closes its store; a second Stop does nothing.
// It must be called from the test's goroutine.
func (s *Server) Stop() { s.stop() }

// ClientFor returns a client with the identity of a kubeconfig the server
// wrote (layout.KubeconfigFile: the drivers'; layout.IdentityKubeconfigFile:
// another role's).
func (s *Server) ClientFor(t testing.TB, kubeconfig string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// KubeconfigFile is the kubeconfig written for the devicemanager (the
// internal identity); layout.KubeconfigFile is the drivers'.
func KubeconfigFile(root string) string {
	return localapi.KubeconfigPath(root, localapi.Internal)
}
