package kubeaccess

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/services/apiserver/apiservertest"
)

const testNode = "node-a"

// TestLocalAPIFollowsTheKubeconfig: the dramanager's client is made
// before nodeplug-apiserver ever ran; its calls fail naming it until the
// kubeconfig appears, then reach the server it names, and again after the
// server was stopped and served anew.
func TestLocalAPIFollowsTheKubeconfig(t *testing.T) {
	root := testutil.TempDir(t)
	a, err := Open(Options{RootDir: root, NodeName: testNode})
	if err != nil {
		t.Fatal(err)
	}
	if !a.Local || a.Kubeconfig != apiservertest.KubeconfigFile(root) {
		t.Fatalf("Open without --kubeconfig: local %v, kubeconfig %s; want the node-local one, %s", a.Local, a.Kubeconfig, apiservertest.KubeconfigFile(root))
	}
	ctx := context.Background()
	_, err = a.Client.CoreV1().Nodes().Get(ctx, testNode, metav1.GetOptions{})
	if !errors.Is(err, ErrNoLocalAPI) || !strings.Contains(err.Error(), "nodeplug-apiserver") {
		t.Fatalf("a call before nodeplug-apiserver ran: %v; want ErrNoLocalAPI naming nodeplug-apiserver", err)
	}
	for round := range 2 {
		s := apiservertest.Start(t, root, testNode)
		if _, err := a.Client.CoreV1().Nodes().Get(ctx, testNode, metav1.GetOptions{}); err != nil {
			t.Fatalf("round %d: the Node through the node-local API: %v", round, err)
		}
		s.Stop()
		_, err := a.Client.CoreV1().Nodes().Get(ctx, testNode, metav1.GetOptions{})
		if err == nil || !strings.Contains(err.Error(), "the node-local resource API (nodeplug-apiserver) at "+s.Addr) {
			t.Fatalf("round %d: a call while nodeplug-apiserver is down: %v; want it named with its address", round, err)
		}
	}
}

// TestKubeconfigUsesThatServer: with --kubeconfig the client reaches the
// server it names (here a node-local API standing in for a cluster's),
// and a missing or invalid file is an error naming the flag.
func TestKubeconfigUsesThatServer(t *testing.T) {
	cluster := testutil.TempDir(t)
	apiservertest.Start(t, cluster, testNode)
	root := testutil.TempDir(t)
	a, err := Open(Options{RootDir: root, Kubeconfig: apiservertest.KubeconfigFile(cluster), NodeName: testNode})
	if err != nil {
		t.Fatal(err)
	}
	if a.Local {
		t.Fatal("a --kubeconfig API is taken for the node-local one")
	}
	if _, err := a.Client.CoreV1().Nodes().Get(context.Background(), testNode, metav1.GetOptions{}); err != nil {
		t.Fatalf("the kubeconfig's server: %v", err)
	}
	if _, err := Open(Options{RootDir: root, Kubeconfig: root + "/missing"}); err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Fatalf("a missing kubeconfig: %v", err)
	}
	bad := root + "/bad"
	if err := os.WriteFile(bad, []byte("not: [a kubeconfig"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{RootDir: root, Kubeconfig: bad}); err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Fatalf("an invalid kubeconfig: %v", err)
	}
	if _, err := Open(Options{RootDir: root, NodeName: "Not_A_Node"}); err == nil || !strings.Contains(err.Error(), "--node-name") {
		t.Fatalf("an invalid --node-name: %v", err)
	}
}
