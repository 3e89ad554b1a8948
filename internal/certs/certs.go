// Package certs makes throwaway certificates for nodeplug's mutual TLS: a
// certificate authority held in memory, and server and client certificates
// it signs, written as PEM files. nodeplug-bench -api-tcp uses it when it is
// given no certificates, and the TLS tests use it. It is not a way to run a
// real node's PKI: the keys live as long as the files, and nothing rotates.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority whose key is held in memory.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	PEM  []byte // Cert, PEM-encoded
}

// Spec describes a certificate to issue.
type Spec struct {
	// Name is the subject's CommonName; IssueFiles names the files after it.
	Name string
	// Orgs are the subject's Organization values: for a nodeplug client,
	// its roles (access.OrgPrefix + "reader", "operator" or "internal").
	Orgs []string
	// Server makes a server certificate (ServerAuth) for Hosts; otherwise
	// a client certificate (ClientAuth).
	Server bool
	// Hosts are the server's IP addresses and DNS names (default
	// 127.0.0.1, ::1 and localhost).
	Hosts []string
	// NotAfter ends the validity (default a day from now). A time in the
	// past makes an expired certificate.
	NotAfter time.Time
}

// NewCA returns a new CA named name, valid for a day (from an hour ago).
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Issue returns a certificate signed by ca, and its private key, both
// PEM-encoded.
func (ca *CA) Issue(s Spec) (certPEM, keyPEM []byte, err error) {
	if s.Name == "" {
		return nil, nil, errors.New("a certificate needs a name")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	notBefore, notAfter := time.Now().Add(-time.Hour), s.NotAfter
	if notAfter.IsZero() {
		notAfter = time.Now().Add(24 * time.Hour)
	}
	if !notAfter.After(notBefore) {
		notBefore = notAfter.Add(-time.Hour)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: s.Name, Organization: s.Orgs},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if s.Server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		hosts := s.Hosts
		if len(hosts) == 0 {
			hosts = []string{"127.0.0.1", "::1", "localhost"}
		}
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// IssueFiles issues a certificate as Issue does and writes it and its key
// into dir as <name>.crt and <name>.key (mode 0600), returning their paths.
func (ca *CA) IssueFiles(dir string, s Spec) (certFile, keyFile string, err error) {
	certPEM, keyPEM, err := ca.Issue(s)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, s.Name+".crt"), filepath.Join(dir, s.Name+".key")
	if err := WriteFile(keyFile, keyPEM); err != nil {
		return "", "", err
	}
	if err := WriteFile(certFile, certPEM); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// WriteFile writes data to path (mode 0600) through a temporary file and a
// rename, as a secret volume replaces its files: a reader never sees half
// a file.
func WriteFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// Files are the PEM files of one mutual TLS setup: what the services take
// (--tls-cert-file, --tls-key-file, --tls-client-ca-file) and what a client
// takes (--tls-cert-file, --tls-key-file, --tls-ca-file).
type Files struct {
	CA                    string // the CA certificate: the servers' and the client's issuer
	ServerCert, ServerKey string
	ClientCert, ClientKey string
}

// Generate makes a new CA in dir (created 0700) with a server certificate
// for loopback (127.0.0.1, ::1, localhost) and a client certificate named
// client with orgs as its Organization, all signed by that CA, and returns
// the files' paths. The CA's key is not written: nothing else can be
// signed with it once Generate returns.
func Generate(dir, client string, orgs []string) (Files, error) {
	if client == "" || client == "server" || client == "ca" {
		return Files{}, fmt.Errorf("client name %q is empty or clashes with the other files", client)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Files{}, err
	}
	ca, err := NewCA("nodeplug throwaway CA")
	if err != nil {
		return Files{}, err
	}
	f := Files{CA: filepath.Join(dir, "ca.crt")}
	if err := WriteFile(f.CA, ca.PEM); err != nil {
		return Files{}, err
	}
	if f.ServerCert, f.ServerKey, err = ca.IssueFiles(dir, Spec{Name: "server", Server: true}); err != nil {
		return Files{}, fmt.Errorf("server certificate: %w", err)
	}
	if f.ClientCert, f.ClientKey, err = ca.IssueFiles(dir, Spec{Name: client, Orgs: orgs}); err != nil {
		return Files{}, fmt.Errorf("client certificate: %w", err)
	}
	return f, nil
}

// serialNumber returns a random 128-bit serial number.
func serialNumber() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
}
