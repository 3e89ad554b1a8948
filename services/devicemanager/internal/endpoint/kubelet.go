package endpoint

// KubeletError is an error whose text toward a plugin is the kubelet's own:
// the legacy Register on kubelet.sock returns Kubelet as a plain error (gRPC
// code Unknown), as the kubelet does, while nodeplug's own API returns
// Error(), which may add detail, with the code of Kind.
type KubeletError struct {
	// Kubelet is the kubelet's message for this failure.
	Kubelet string
	// Detail, when set, is what nodeplug's own API says instead.
	Detail string
	// Kind is the errdefs sentinel that gives the code on nodeplug's API.
	Kind error
}

// Error returns Detail (else Kubelet) and Kind's text.
func (e *KubeletError) Error() string {
	msg := e.Detail
	if msg == "" {
		msg = e.Kubelet
	}
	if e.Kind == nil {
		return msg
	}
	return msg + ": " + e.Kind.Error()
}

// Unwrap returns Kind.
func (e *KubeletError) Unwrap() error { return e.Kind }

// KubeletMessage returns what the kubelet says.
func (e *KubeletError) KubeletMessage() string { return e.Kubelet }
