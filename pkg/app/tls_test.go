package app

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/internal/certs"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	*certs.CA
	file string // its certificate, PEM
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	c, err := certs.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	ca := &testCA{CA: c, file: filepath.Join(dir, name+".pem")}
	if err := certs.WriteFile(ca.file, c.PEM); err != nil {
		t.Fatal(err)
	}
	return ca
}

// issue writes a certificate signed by ca, and its key, into dir: a server
// certificate for 127.0.0.1, or a client certificate with orgs as its
// Organization.
func (ca *testCA) issue(t *testing.T, dir, name string, server bool, orgs ...string) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile, err := ca.IssueFiles(dir, certs.Spec{Name: name, Orgs: orgs, Server: server, Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// runTCP runs a service serving the devicemanager's API (unimplemented: a
// call the access check lets through answers UNIMPLEMENTED) on its socket
// and on --listen-tcp 127.0.0.1:0 with tls, and returns the bound TCP
// address.
func runTCP(t *testing.T, tls TLS) string {
	t.Helper()
	root := testutil.TempDir(t)
	cfg := Config{Binary: "test", RootDir: root, APISocket: layout.APISocket(root, "test"), ListenTCP: "127.0.0.1:0", TLS: tls,
		LogLevel: "info", LogFormat: "text"}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	addrc := make(chan string, 1)
	svc := Service{Binary: "test", Setup: func(_ context.Context, rt *Runtime) error {
		dmv1.RegisterDeviceManagerServiceServer(rt.Server, dmv1.UnimplementedDeviceManagerServiceServer{})
		addrc <- rt.TCPAddr.String()
		return nil
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, svc, cfg, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case addr := <-addrc:
		return addr
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	return ""
}

// tcpCalls dials addr with the client flags of tls and returns the codes
// of a health check, a reader's call (ListAllocations) and an operator's
// (Allocate).
func tcpCalls(t *testing.T, tls *TLS, addr string) (health, list, allocate codes.Code) {
	t.Helper()
	conn, err := tls.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	health = status.Code(err)
	dm := dmv1.NewDeviceManagerServiceClient(conn)
	_, err = dm.ListAllocations(ctx, &dmv1.ListAllocationsRequest{})
	list = status.Code(err)
	_, err = dm.Allocate(ctx, &dmv1.AllocateRequest{})
	allocate = status.Code(err)
	return health, list, allocate
}

// TestListenTCPWithMutualTLS runs a service with --listen-tcp and the
// server TLS flags, and dials it with the client TLS flags (as the
// reconciler and nodeplugctl do): a reader's certificate may list but not
// allocate, a client without the TLS flags is refused before dialling, and
// a certificate from another CA is refused at the handshake.
func TestListenTCPWithMutualTLS(t *testing.T) {
	dir := testutil.TempDir(t)
	serverCA, clientCA, otherCA := newTestCA(t, dir, "server-ca"), newTestCA(t, dir, "client-ca"), newTestCA(t, dir, "other-ca")
	cert, key := serverCA.issue(t, dir, "server", true)
	addr := runTCP(t, TLS{CertFile: cert, KeyFile: key, ClientCAFile: clientCA.file})

	readerCert, readerKey := clientCA.issue(t, dir, "reader", false, "nodeplug:reader")
	reader := &TLS{CertFile: readerCert, KeyFile: readerKey, CAFile: serverCA.file}
	if h, l, a := tcpCalls(t, reader, addr); h != codes.OK || l != codes.Unimplemented || a != codes.PermissionDenied {
		t.Errorf("reader certificate: health %s, ListAllocations %s, Allocate %s; want OK, UNIMPLEMENTED (let through), PERMISSION_DENIED", h, l, a)
	}
	opCert, opKey := clientCA.issue(t, dir, "operator", false, "nodeplug:operator")
	if h, l, a := tcpCalls(t, &TLS{CertFile: opCert, KeyFile: opKey, CAFile: serverCA.file}, addr); h != codes.OK || l != codes.Unimplemented || a != codes.Unimplemented {
		t.Errorf("operator certificate: health %s, ListAllocations %s, Allocate %s; want OK, UNIMPLEMENTED, UNIMPLEMENTED (let through)", h, l, a)
	}
	strangerCert, strangerKey := otherCA.issue(t, dir, "stranger", false, "nodeplug:internal")
	if h, _, _ := tcpCalls(t, &TLS{CertFile: strangerCert, KeyFile: strangerKey, CAFile: serverCA.file}, addr); h != codes.Unavailable {
		t.Errorf("certificate from another CA: health %s, want UNAVAILABLE (refused at the handshake)", h)
	}
	if _, err := (&TLS{}).Dial(addr); err == nil || !strings.Contains(err.Error(), "--tls-cert-file") {
		t.Errorf("dialling TCP without the TLS flags: %v, want an error naming them", err)
	}
}

// TestInsecureTCP: --insecure-tcp serves plain TCP on loopback, where every
// caller has every role (tests only), and dials only loopback addresses.
func TestInsecureTCP(t *testing.T) {
	addr := runTCP(t, TLS{Insecure: true})
	if h, l, a := tcpCalls(t, &TLS{Insecure: true}, addr); h != codes.OK || l != codes.Unimplemented || a != codes.Unimplemented {
		t.Errorf("plain TCP: health %s, ListAllocations %s, Allocate %s; want every call let through", h, l, a)
	}
	if _, err := (&TLS{Insecure: true}).Dial("192.0.2.1:50053"); err == nil {
		t.Error("--insecure-tcp dialled a non-loopback address")
	}
}
