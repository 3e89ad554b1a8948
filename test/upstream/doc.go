// Package upstream runs nodeplug's services against the kubelet's own test
// plugins (k8s.io/kubernetes: the device plugin Stub of
// pkg/kubelet/cm/devicemanager/plugin/v1beta1 and the example plugin of
// pkg/kubelet/pluginmanager/pluginwatcher) and checks that they treat them
// as a kubelet does. The DRA tests (dra*_test.go) run the upstream DRA test
// driver (k8s.io/kubernetes/test/e2e/dra/test-driver/app, built on the
// k8s.io/dynamic-resource-allocation/kubeletplugin helper) as a process of
// its own, cmd/dradriver, against the node-local resource API of
// nodeplug-apiserver with nothing but KUBECONFIG and its usual flags. It is a module of its own so that the main
// module's dependencies stay small; run it with
//
//	cd test/upstream && go test -race ./...
//
// The tests build the services from the checkout (the replace of
// github.com/nodeplug/nodeplug => ../..) once, in TestMain.
package upstream
