package certs_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/certs"
	"github.com/nodeplug/nodeplug/pkg/access"
)

// TestGenerateHandshake: the files Generate writes make a mutual TLS
// handshake on 127.0.0.1 through access's own server and client
// configurations, and the server sees the client's Organization as its role.
func TestGenerateHandshake(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	f, err := certs.Generate(dir, "bench", []string{access.OrgPrefix + "operator"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{f.CA, f.ServerCert, f.ServerKey, f.ClientCert, f.ClientKey} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", p, fi.Mode().Perm())
		}
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("directory %s: %v %v, want mode 0700", dir, fi.Mode().Perm(), err)
	}

	// The client side as nodeplug's clients build it; the server side as
	// access.ServerTLS does (mutual, TLS 1.3).
	client, err := access.ClientTLS(f.ClientCert, f.ClientKey, f.CA)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := access.NewServerTLS(f.ServerCert, f.ServerKey, f.CA); err != nil {
		t.Fatal(err)
	}
	serverCert, err := tls.LoadX509KeyPair(f.ServerCert, f.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{MinVersion: tls.VersionTLS13,
		Certificates: []tls.Certificate{serverCert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool})
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	type seen struct {
		orgs []string
		err  error
	}
	seenc := make(chan seen, 1)
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			tc := conn.(*tls.Conn)
			if err := tc.Handshake(); err != nil {
				seenc <- seen{err: err}
			} else {
				seenc <- seen{orgs: tc.ConnectionState().PeerCertificates[0].Subject.Organization}
			}
			conn.Close()
		}
	}()
	// A server certificate for loopback by address and by name.
	for _, host := range []string{"127.0.0.1", "localhost"} {
		cfg := client.Clone()
		cfg.ServerName = host
		conn, err := tls.Dial("tcp", lis.Addr().String(), cfg)
		if err != nil {
			t.Fatalf("handshake as %s: %v", host, err)
		}
		s := <-seenc
		conn.Close()
		if s.err != nil {
			t.Fatalf("server handshake with %s: %v", host, s.err)
		}
		if access.RoleFromOrganizations(s.orgs) != access.RoleOperator {
			t.Errorf("the server sees Organization %v, want the operator role", s.orgs)
		}
	}
}

// TestIssue covers the certificate fields the TLS checks depend on.
func TestIssue(t *testing.T) {
	ca, err := certs.NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	parse := func(certPEM []byte) *x509.Certificate {
		t.Helper()
		b, _ := pem.Decode(certPEM)
		if b == nil {
			t.Fatal("no PEM block")
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)

	srvPEM, _, err := ca.Issue(certs.Spec{Name: "srv", Server: true, Hosts: []string{"10.0.0.5", "node.example"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := parse(srvPEM)
	for _, host := range []string{"10.0.0.5", "node.example"} {
		if _, err := srv.Verify(x509.VerifyOptions{Roots: roots, DNSName: host, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("server certificate for %s: %v", host, err)
		}
	}
	if _, err := srv.Verify(x509.VerifyOptions{Roots: roots, DNSName: "127.0.0.1"}); err == nil {
		t.Error("a server certificate with explicit hosts also verified for 127.0.0.1")
	}

	cliPEM, _, err := ca.Issue(certs.Spec{Name: "cli", Orgs: []string{"nodeplug:reader"}})
	if err != nil {
		t.Fatal(err)
	}
	cli := parse(cliPEM)
	if _, err := cli.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate: %v", err)
	}
	if _, err := cli.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Error("a client certificate verified as a server's")
	}
	if access.RoleFromOrganizations(cli.Subject.Organization) != access.RoleReader {
		t.Errorf("client certificate's Organization %v does not give the reader role", cli.Subject.Organization)
	}

	oldPEM, _, err := ca.Issue(certs.Spec{Name: "old", NotAfter: time.Now().Add(-time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	var invalid x509.CertificateInvalidError
	if _, err := parse(oldPEM).Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); !errors.As(err, &invalid) || invalid.Reason != x509.Expired {
		t.Errorf("expired certificate: %v, want an expiry error", err)
	}
	if _, _, err := ca.Issue(certs.Spec{}); err == nil {
		t.Error("a certificate without a name was issued")
	}
	if _, err := certs.Generate(t.TempDir(), "server", nil); err == nil {
		t.Error("Generate accepted a client named like the server's files")
	}
}
