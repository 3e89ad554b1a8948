// Package kubeaccess gives the dramanager its Kubernetes API client: a
// cluster's, named by --kubeconfig, or else the node-local resource API
// that nodeplug-apiserver serves, reached through the kubeconfig it writes
// for the dramanager (<root>/nodeplug/kubeconfig-internal). Either way
// the API is another process: the rest of the dramanager gets a
// client-go kubernetes.Interface and the node name, and nothing here
// serves anything.
package kubeaccess

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/nodename"
)

// userAgent is how the API's logs and metrics name the dramanager.
const userAgent = "nodeplug-dramanager"

// Options configures Open.
type Options struct {
	RootDir string
	// Kubeconfig names a cluster's API server; empty: the node-local one.
	Kubeconfig string
	// NodeName is the one Node (default: the host name).
	NodeName string
}

// Access is the API the dramanager uses.
type Access struct {
	Client kubernetes.Interface
	// Config is Client's configuration.
	Config *rest.Config
	// NodeName is the node whose slices and claims are handled here.
	NodeName string
	// Kubeconfig is the file Config was read from.
	Kubeconfig string
	// Local: the API is the node-local one (nodeplug-apiserver).
	Local bool
	// Identity is who the API takes the dramanager to be: not known until
	// the start check (Checker) asked a cluster's API; with the node-local
	// API, the internal identity of its kubeconfig.
	Identity *Identity
}

// LocalKubeconfig is the kubeconfig nodeplug-apiserver writes for the
// dramanager under root.
func LocalKubeconfig(root string) string { return layout.IdentityKubeconfigFile(root, "internal") }

// Open builds the client: for --kubeconfig, from that file (errors name
// the flag); for the node-local API, over a transport that reads the
// kubeconfig nodeplug-apiserver writes for the dramanager at each
// request that finds it changed (localTransport). Nothing waits for the
// API, and no request is made: an API server that is not up yet, or that
// was restarted on another port, is found by the calls, each of which
// fails on its own (naming nodeplug-apiserver) while the rest of the
// dramanager serves.
func Open(opts Options) (*Access, error) {
	node, err := nodename.Resolve(opts.NodeName)
	if err != nil {
		return nil, err
	}
	a := &Access{NodeName: node, Kubeconfig: opts.Kubeconfig, Identity: unknownIdentity("not asked yet")}
	if a.Kubeconfig == "" {
		a.Local, a.Kubeconfig = true, LocalKubeconfig(opts.RootDir)
		a.Identity = unknownIdentity("nodeplug-apiserver serves no SelfSubjectReview; the credentials are those of " + a.Kubeconfig)
		a.Config = &rest.Config{
			// Requests are sent to the server the kubeconfig names; this
			// host only appears where the file could not be read.
			Host:      "https://" + localHost,
			Transport: &localTransport{path: a.Kubeconfig},
			// The node-local API serves this node alone: no client-side
			// throttling between the dramanager and it.
			QPS: -1,
		}
	} else if a.Config, err = clientcmd.BuildConfigFromFlags("", a.Kubeconfig); err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", a.Kubeconfig, err)
	}
	a.Config.UserAgent = userAgent
	if a.Client, err = kubernetes.NewForConfig(a.Config); err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", a.Config.Host, err)
	}
	return a, nil
}
