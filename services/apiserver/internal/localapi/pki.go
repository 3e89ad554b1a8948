package localapi

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/nodeplug/nodeplug/services/apiserver/internal/resourceapi"
)

// Validity of what the PKI issues. A certificate that expires within
// renewBefore, names other hosts (the server's) or was not signed by the
// CA on disk is issued again at start.
const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 2 * 365 * 24 * time.Hour
	renewBefore  = 30 * 24 * time.Hour
)

// Identity is one client certificate the PKI issues: its file name, its
// CommonName and its role (the certificate's Organization).
type Identity struct {
	Name string // file base name: <name>.crt, <name>.key
	User string // CommonName
	Role string // Organization
}

// The identities issued at first start.
var (
	Driver   = Identity{Name: "driver", User: "nodeplug-driver", Role: resourceapi.RoleDriver}
	Operator = Identity{Name: "operator", User: "nodeplug-operator", Role: resourceapi.RoleOperator}
	Reader   = Identity{Name: "reader", User: "nodeplug-reader", Role: resourceapi.RoleReader}
	Internal = Identity{Name: "internal", User: "nodeplug-dramanager", Role: resourceapi.RoleInternal}

	Identities = []Identity{Driver, Operator, Reader, Internal}
)

// PKI is the node-local API's certificate authority and what it signed,
// kept as PEM files in Dir (ca.crt, ca.key, server.crt, server.key and a
// pair per Identity; keys 0600).
type PKI struct {
	Dir   string
	CAPEM []byte
	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
}

// EnsurePKI loads the PKI in dir (created 0700), making the CA and the
// certificates that are missing, expiring or wrong; hosts are the server
// certificate's IP addresses and names.
func EnsurePKI(dir string, hosts []string) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("PKI directory %s: %w", dir, err)
	}
	p := &PKI{Dir: dir}
	fresh, err := p.loadOrMakeCA()
	if err != nil {
		return nil, err
	}
	if err := p.ensureLeaf("server", "nodeplug-resource-api", "", hosts, fresh); err != nil {
		return nil, err
	}
	for _, id := range Identities {
		if err := p.ensureLeaf(id.Name, id.User, id.Role, nil, fresh); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func (p *PKI) file(name string) string { return filepath.Join(p.Dir, name) }

// loadOrMakeCA reads ca.crt and ca.key, or makes a new CA when either is
// missing or unusable (fresh: every certificate must be issued again).
func (p *PKI) loadOrMakeCA() (fresh bool, err error) {
	cert, key, err := loadPair(p.file("ca.crt"), p.file("ca.key"))
	if err == nil && cert.IsCA && time.Until(cert.NotAfter) > renewBefore {
		p.ca, p.caKey, p.CAPEM = cert, key, pemCert(cert.Raw)
		return false, nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("the resource API's CA in %s is unusable (remove ca.crt and ca.key to make a new one): %w", p.Dir, err)
	}
	key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return false, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "nodeplug resource API CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(caValidity),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return false, err
	}
	if p.ca, err = x509.ParseCertificate(der); err != nil {
		return false, err
	}
	p.caKey, p.CAPEM = key, pemCert(der)
	if err := writePair(p.file("ca.crt"), p.file("ca.key"), der, key); err != nil {
		return false, err
	}
	return true, nil
}

// ensureLeaf keeps <name>.crt/.key when they are signed by the CA, valid
// long enough and (for the server) name every host; otherwise issues them.
func (p *PKI) ensureLeaf(name, cn, org string, hosts []string, fresh bool) error {
	certFile, keyFile := p.file(name+".crt"), p.file(name+".key")
	if !fresh {
		if cert, _, err := loadPair(certFile, keyFile); err == nil && p.good(cert, cn, org, hosts) {
			return nil
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: cn},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(leafValidity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if org != "" {
		tmpl.Subject.Organization = []string{org}
	}
	if hosts != nil {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		return fmt.Errorf("issue the %s certificate: %w", name, err)
	}
	return writePair(certFile, keyFile, der, key)
}

// good: signed by the CA, not expiring soon, the same subject, and for a
// server certificate every host.
func (p *PKI) good(cert *x509.Certificate, cn, org string, hosts []string) bool {
	if cert.CheckSignatureFrom(p.ca) != nil || time.Until(cert.NotAfter) < renewBefore || cert.Subject.CommonName != cn {
		return false
	}
	if org != "" && !slices.Equal(cert.Subject.Organization, []string{org}) {
		return false
	}
	for _, h := range hosts {
		if cert.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

// ServerTLS is the server's TLS configuration: its certificate, and client
// certificates verified against the CA when given (a request without one
// is anonymous, which the API answers 401).
func (p *PKI) ServerTLS() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(p.file("server.crt"), p.file("server.key"))
	if err != nil {
		return nil, fmt.Errorf("resource API server certificate: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	return &tls.Config{
		MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert},
		ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: pool,
	}, nil
}

// ClientPEM returns an identity's certificate and key, PEM-encoded.
func (p *PKI) ClientPEM(id Identity) (certPEM, keyPEM []byte, err error) {
	if certPEM, err = os.ReadFile(p.file(id.Name + ".crt")); err != nil {
		return nil, nil, err
	}
	if keyPEM, err = os.ReadFile(p.file(id.Name + ".key")); err != nil {
		return nil, nil, err
	}
	return certPEM, keyPEM, nil
}

func loadPair(certFile, keyFile string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		if _, serr := os.Stat(certFile); errors.Is(serr, os.ErrNotExist) {
			return nil, nil, serr
		}
		if _, serr := os.Stat(keyFile); errors.Is(serr, os.ErrNotExist) {
			return nil, nil, serr
		}
		return nil, nil, err
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, fmt.Errorf("%s: not an ECDSA key", keyFile)
	}
	return pair.Leaf, key, nil
}

// writePair writes the key (0600) then the certificate, each durably.
func writePair(certFile, keyFile string, der []byte, key *ecdsa.PrivateKey) error {
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := WriteFileAtomic(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return err
	}
	return WriteFileAtomic(certFile, pemCert(der), 0o644)
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

// WriteFileAtomic writes data to path with mode through a temporary file
// (created exclusively, not through a symbolic link), fsynced, renamed
// over path, and the directory fsynced: a reader sees the old file or the
// new one, and a crash loses neither.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	_ = os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, mode)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Chmod(mode)
	}
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, werr)
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
