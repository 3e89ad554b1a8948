package access_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/internal/certs"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/access"
)

// ca is a test certificate authority.
type ca struct{ *certs.CA }

func newCA(t *testing.T) *ca {
	t.Helper()
	c, err := certs.NewCA("nodeplug test CA")
	if err != nil {
		t.Fatal(err)
	}
	return &ca{c}
}

// issue writes a certificate and key signed by c into dir and returns
// their paths: a server certificate for 127.0.0.1, or a client certificate
// with orgs as its Organization.
func (c *ca) issue(t *testing.T, dir, name string, orgs []string, server bool, notAfter time.Time) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile, err := c.IssueFiles(dir, certs.Spec{Name: name, Orgs: orgs, Server: server, Hosts: []string{"127.0.0.1"}, NotAfter: notAfter})
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// write writes then renames, as a secret volume replaces its files.
func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := certs.WriteFile(path, data); err != nil {
		t.Fatal(err)
	}
}

// tlsServer serves the policy over TCP with mutual TLS.
func tlsServer(t *testing.T, dir string, serverCA, clientCA *ca) (addr string) {
	t.Helper()
	cert, key := serverCA.issue(t, dir, "server", nil, true, time.Now().Add(time.Hour))
	caFile := filepath.Join(dir, "client-ca.pem")
	write(t, caFile, clientCA.PEM)
	st, err := access.NewServerTLS(cert, key, caFile)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, lis, &access.Credentials{TLS: st}, false)
	return lis.Addr().String()
}

func dialTLS(t *testing.T, addr string, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func clientConfig(t *testing.T, dir string, issuer, serverCA *ca, name string, orgs []string, notAfter time.Time) *tls.Config {
	t.Helper()
	cert, key := issuer.issue(t, dir, name, orgs, false, notAfter)
	caFile := filepath.Join(dir, name+"-server-ca.pem")
	write(t, caFile, serverCA.PEM)
	cfg, err := access.ClientTLS(cert, key, caFile)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// refused checks that a connection is refused at the handshake: every call
// fails UNAVAILABLE, and never reaches the service.
func refused(t *testing.T, who string, conn *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("%s: health answered %v, want a refused handshake (UNAVAILABLE)", who, err)
	}
}

func TestMutualTLS(t *testing.T) {
	dir := testutil.TempDir(t)
	serverCA, clientCA, otherCA := newCA(t), newCA(t), newCA(t)
	addr := tlsServer(t, dir, serverCA, clientCA)
	later := time.Now().Add(time.Hour)

	t.Run("roles from the certificate", func(t *testing.T) {
		for _, tc := range []struct {
			orgs []string
			role access.Role
		}{
			{[]string{"nodeplug:reader"}, access.RoleReader},
			{[]string{"nodeplug:operator"}, access.RoleOperator},
			{[]string{"nodeplug:internal"}, access.RoleInternal},
			{[]string{"example.com"}, access.RoleNone},
		} {
			name := "client-" + tc.role.String()
			conn := dialTLS(t, addr, clientConfig(t, dir, clientCA, serverCA, name, tc.orgs, later))
			sameCodes(t, name, calls(t, conn), want(tc.role))
		}
	})
	t.Run("expired certificate", func(t *testing.T) {
		refused(t, "expired", dialTLS(t, addr, clientConfig(t, dir, clientCA, serverCA, "expired", []string{"nodeplug:internal"}, time.Now().Add(-time.Hour))))
	})
	t.Run("wrong CA", func(t *testing.T) {
		refused(t, "wrong CA", dialTLS(t, addr, clientConfig(t, dir, otherCA, serverCA, "stranger", []string{"nodeplug:internal"}, later)))
	})
	t.Run("no client certificate", func(t *testing.T) {
		pool := x509.NewCertPool()
		pool.AddCert(serverCA.Cert)
		refused(t, "no certificate", dialTLS(t, addr, &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool}))
	})
}

// TestTLSReload: the server reads its files again when they change, so a
// client CA (or certificate) rotated on disk takes effect without a
// restart; a broken rewrite keeps the last good configuration.
func TestTLSReload(t *testing.T) {
	dir := testutil.TempDir(t)
	serverCA, oldCA, newCA := newCA(t), newCA(t), newCA(t)
	addr := tlsServer(t, dir, serverCA, oldCA)
	later := time.Now().Add(time.Hour)
	newClient := clientConfig(t, dir, newCA, serverCA, "rotated", []string{"nodeplug:reader"}, later)
	refused(t, "before the rotation", dialTLS(t, addr, newClient))

	write(t, filepath.Join(dir, "client-ca.pem"), newCA.PEM)
	sameCodes(t, "after the rotation", calls(t, dialTLS(t, addr, newClient)), want(access.RoleReader))
	refused(t, "old CA after the rotation", dialTLS(t, addr, clientConfig(t, dir, oldCA, serverCA, "old", []string{"nodeplug:reader"}, later)))

	write(t, filepath.Join(dir, "client-ca.pem"), []byte("not a certificate"))
	sameCodes(t, "after a broken rewrite", calls(t, dialTLS(t, addr, newClient)), want(access.RoleReader))
}

func TestTLSNeedsAllFiles(t *testing.T) {
	if _, err := access.NewServerTLS("a.crt", "", "ca.pem"); err == nil {
		t.Error("a server TLS set without a key was accepted")
	}
	if _, err := access.ClientTLS("", "k", "ca"); err == nil {
		t.Error("a client TLS set without a certificate was accepted")
	}
}

// TestInsecureTCPIsOpenOnlyWhenAllowed: without TLS, a TCP caller has no
// identity: refused everything but health, unless the guard was opened for
// tests.
func TestInsecureTCPIsOpenOnlyWhenAllowed(t *testing.T) {
	for _, open := range []bool{false, true} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		serve(t, lis, &access.Credentials{}, open)
		conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecureCreds()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		expect := want(access.RoleNone)
		if open {
			expect = want(access.RoleInternal)
		}
		sameCodes(t, "plain TCP", calls(t, conn), expect)
	}
}
