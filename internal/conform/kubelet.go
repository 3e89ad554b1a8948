package conform

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/pkg/kubeletrules"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// registration is one Register call on conform's kubelet.sock.
type registration struct {
	req *pluginapi.RegisterRequest
	at  time.Time
	// ruleErr: the request breaks the kubelet's rules (version, resource
	// name, endpoint); nothing was dialled.
	ruleErr error
	// sess: the endpoint it named, connected as the kubelet connects
	// (GetDevicePluginOptions answered or sess.optsErr says why not); nil
	// when ruleErr is set or the endpoint could not be dialled (dialErr).
	sess    *session
	dialErr error
}

// kubelet serves v1beta1.Registration on <root>/device-plugins/kubelet.sock
// as the kubelet does: Register checks the version and the resource name,
// joins the endpoint to the directory, and connects (dial, then
// GetDevicePluginOptions) before it answers. Every call is recorded.
type kubelet struct {
	pluginapi.UnimplementedRegistrationServer
	dir     string // the device-plugins directory
	timeout time.Duration
	log     *slog.Logger

	mu      sync.Mutex
	regs    []*registration
	changed chan struct{}
	srv     *grpc.Server
	lis     net.Listener
	served  chan struct{}
}

func newKubelet(dir string, timeout time.Duration, log *slog.Logger) *kubelet {
	return &kubelet{dir: dir, timeout: timeout, log: log, changed: make(chan struct{})}
}

func (k *kubelet) socket() string { return filepath.Join(k.dir, layout.KubeletSocketName) }

// start listens on kubelet.sock and serves.
func (k *kubelet) start() error {
	lis, err := unixsock.Listen(k.socket())
	if err != nil {
		return fmt.Errorf("serve kubelet.sock: %w", err)
	}
	srv, _ := rpcutil.NewServer(k.log)
	pluginapi.RegisterRegistrationServer(srv, k)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	k.mu.Lock()
	k.srv, k.lis, k.served = srv, lis, served
	k.mu.Unlock()
	return nil
}

// stop stops serving and removes kubelet.sock. Sessions made by Register
// stay open (the caller closes them).
func (k *kubelet) stop() {
	k.mu.Lock()
	srv, lis, served := k.srv, k.lis, k.served
	k.srv = nil
	k.mu.Unlock()
	if srv == nil {
		return
	}
	srv.Stop()
	<-served
	_ = lis.Close()
}

// cleanup removes every socket in the directory, as the kubelet does at
// start (manager.go, CleanupPluginDirectory): only sockets, only at the top
// level.
func (k *kubelet) cleanup() error {
	entries, err := os.ReadDir(k.dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if e.Type()&fs.ModeSocket != 0 {
			if err := os.Remove(filepath.Join(k.dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// count returns the number of Register calls so far.
func (k *kubelet) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.regs)
}

// next returns the first Register call after the first n, if there is one,
// and a channel closed at the next call.
func (k *kubelet) next(n int) (*registration, <-chan struct{}) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.regs) > n {
		return k.regs[n], nil
	}
	return nil, k.changed
}

// closeSessions closes the sessions of every Register call but keep.
func (k *kubelet) closeSessions(keep *session) {
	k.mu.Lock()
	regs := append([]*registration(nil), k.regs...)
	k.mu.Unlock()
	for _, r := range regs {
		if r.sess != nil && r.sess != keep {
			r.sess.close()
		}
	}
}

// Register implements v1beta1.Registration.
func (k *kubelet) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	r := &registration{req: proto.Clone(req).(*pluginapi.RegisterRequest), at: time.Now()}
	defer func() {
		k.mu.Lock()
		k.regs = append(k.regs, r)
		close(k.changed)
		k.changed = make(chan struct{})
		k.mu.Unlock()
	}()
	if r.ruleErr = validateRegister(ctx, req, k.dir, k.timeout); r.ruleErr != nil {
		return nil, r.ruleErr
	}
	r.sess, r.dialErr = connect(ctx, filepath.Join(k.dir, req.GetEndpoint()), k.timeout)
	switch {
	case r.dialErr != nil:
		return nil, r.dialErr
	case r.sess.optsErr != nil:
		return nil, fmt.Errorf("failed to get device plugin options: %v", r.sess.optsErr)
	}
	return &pluginapi.Empty{}, nil
}

// validateRegister applies the kubelet's rules to a Register request (its
// messages from pkg/kubeletrules) and the endpoint rule: a socket file name
// in the device-plugins directory (the kubelet joins it to the directory),
// waited for as long as the kubelet's dial waits.
func validateRegister(ctx context.Context, req *pluginapi.RegisterRequest, dir string, timeout time.Duration) error {
	if err := kubeletrules.ValidateLegacyRegister(req.GetVersion(), req.GetResourceName()); err != nil {
		return err
	}
	ep := req.GetEndpoint()
	if ep == "" || ep == "." || ep == ".." || strings.Contains(ep, "/") {
		return fmt.Errorf("endpoint %q is not a file name: the kubelet joins it to %s", ep, dir)
	}
	c, err := unixsock.NewConfiner([]string{dir})
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	path := filepath.Join(dir, ep)
	if _, err := c.WaitResolve(wctx, path, nil); err != nil {
		return fmt.Errorf("endpoint %q: %w", ep, err)
	}
	if !unixsock.IsSocket(path) {
		return fmt.Errorf("endpoint %q: %s is not a socket", ep, path)
	}
	return nil
}
