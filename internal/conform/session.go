package conform

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// session is the kubelet's connection to one device plugin endpoint: the
// connection, the options it answered, and the ListAndWatch stream.
type session struct {
	endpoint string
	conn     *grpc.ClientConn
	client   pluginapi.DevicePluginClient

	opts     *pluginapi.DevicePluginOptions
	optsErr  error
	optsTook time.Duration

	stream *watch
}

// connect dials endpoint by its raw path and calls GetDevicePluginOptions,
// waiting for the socket to listen for at most timeout as the kubelet's
// blocking dial does. The session is returned even when the call failed
// (optsErr says so); it is nil only when the endpoint cannot be dialled.
func connect(ctx context.Context, endpoint string, timeout time.Duration) (*session, error) {
	conn, err := rpcutil.DialPlugin(endpoint)
	if err != nil {
		return nil, fmt.Errorf("failed to dial device plugin: %w", err)
	}
	s := &session{endpoint: endpoint, conn: conn, client: pluginapi.NewDevicePluginClient(conn)}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	s.opts, s.optsErr = s.client.GetDevicePluginOptions(cctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	s.optsTook = time.Since(start)
	return s, nil
}

// openStream opens ListAndWatch on the session, replacing (and closing) an
// earlier stream.
func (s *session) openStream() {
	if s.stream != nil {
		s.stream.close()
	}
	s.stream = startWatch(s.client)
}

// close ends the stream and the connection, as a kubelet that stops does.
func (s *session) close() {
	if s == nil {
		return
	}
	if s.stream != nil {
		s.stream.close()
	}
	_ = s.conn.Close()
}

// response is one ListAndWatch response and when it arrived.
type response struct {
	at      time.Time
	devices []*pluginapi.Device
}

// watch reads one ListAndWatch stream in the background and keeps every
// response, so checks can wait for what they need.
type watch struct {
	cancel context.CancelFunc
	done   chan struct{}
	opened time.Time

	mu      sync.Mutex
	resps   []response
	err     error // why the stream ended
	ended   bool
	changed chan struct{} // closed and replaced on every change
}

func startWatch(client pluginapi.DevicePluginClient) *watch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &watch{cancel: cancel, done: make(chan struct{}), opened: time.Now(), changed: make(chan struct{})}
	go w.run(ctx, client)
	return w
}

func (w *watch) run(ctx context.Context, client pluginapi.DevicePluginClient) {
	defer close(w.done)
	st, err := client.ListAndWatch(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	for err == nil {
		var m *pluginapi.ListAndWatchResponse
		if m, err = st.Recv(); err == nil {
			w.update(func() { w.resps = append(w.resps, response{at: time.Now(), devices: m.GetDevices()}) })
		}
	}
	w.update(func() { w.err, w.ended = err, true })
}

func (w *watch) update(f func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f()
	close(w.changed)
	w.changed = make(chan struct{})
}

// close cancels the stream and waits for its reader to stop.
func (w *watch) close() {
	w.cancel()
	<-w.done
}

// snapshot returns the responses so far, whether the stream ended and why.
func (w *watch) snapshot() ([]response, bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]response(nil), w.resps...), w.ended, w.err
}

// waitFor waits until cond holds for the stream's state, ctx ends (false),
// or the stream ends without cond holding (false).
func (w *watch) waitFor(ctx context.Context, cond func(resps []response, ended bool) bool) bool {
	for {
		w.mu.Lock()
		ok := cond(w.resps, w.ended)
		ended, changed := w.ended, w.changed
		w.mu.Unlock()
		if ok {
			return true
		}
		if ended {
			return false
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}

// first waits at most timeout for the first response.
func (w *watch) first(ctx context.Context, timeout time.Duration) (response, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if w.waitFor(cctx, func(r []response, _ bool) bool { return len(r) > 0 }) {
		resps, _, _ := w.snapshot()
		return resps[0], nil
	}
	_, ended, err := w.snapshot()
	if ended {
		return response{}, fmt.Errorf("the stream ended before its first response: %v", err)
	}
	return response{}, fmt.Errorf("no response within %s", timeout)
}
