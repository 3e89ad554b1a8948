package access

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// handshakeTimeout bounds a TLS handshake.
const handshakeTimeout = 10 * time.Second

// ServerTLS is the server side of mutual TLS, read from files and read
// again when any of them changes (checked at each handshake), so that
// certificates can be rotated without a restart. Safe for concurrent use.
type ServerTLS struct {
	CertFile, KeyFile, ClientCAFile string

	mu    sync.Mutex
	stamp string
	cfg   *tls.Config
}

// NewServerTLS loads the files once, so that a bad set fails at start.
func NewServerTLS(certFile, keyFile, clientCAFile string) (*ServerTLS, error) {
	if certFile == "" || keyFile == "" || clientCAFile == "" {
		return nil, errors.New("TCP needs mutual TLS: set --tls-cert-file, --tls-key-file and --tls-client-ca-file")
	}
	s := &ServerTLS{CertFile: certFile, KeyFile: keyFile, ClientCAFile: clientCAFile}
	if _, err := s.config(); err != nil {
		return nil, err
	}
	return s, nil
}

// config returns the current configuration, reloading the files when they
// changed. A reload that fails keeps the previous configuration.
func (s *ServerTLS) config() (*tls.Config, error) {
	stamp := fileStamp(s.CertFile, s.KeyFile, s.ClientCAFile)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg != nil && stamp == s.stamp {
		return s.cfg, nil
	}
	cert, err := tls.LoadX509KeyPair(s.CertFile, s.KeyFile)
	if err != nil {
		if s.cfg != nil {
			return s.cfg, nil
		}
		return nil, fmt.Errorf("TLS certificate %s / key %s: %w", s.CertFile, s.KeyFile, err)
	}
	pool, err := loadPool(s.ClientCAFile)
	if err != nil {
		if s.cfg != nil {
			return s.cfg, nil
		}
		return nil, err
	}
	s.cfg = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		NextProtos:   []string{"h2"},
	}
	s.stamp = stamp
	return s.cfg, nil
}

// fileStamp summarises the identity and modification time of files, so a
// rewrite or a replacement (as a Kubernetes secret volume does) is seen.
func fileStamp(paths ...string) string {
	var out string
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			out += p + ":missing;"
			continue
		}
		out += fmt.Sprintf("%s:%d:%d;", p, fi.Size(), fi.ModTime().UnixNano())
	}
	return out
}

func loadPool(caFile string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("TLS CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("TLS CA file %s holds no PEM certificate", caFile)
	}
	return pool, nil
}

// ClientTLS returns the client side of mutual TLS: the client certificate
// and the CA that signs the servers' certificates.
func ClientTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	if certFile == "" || keyFile == "" || caFile == "" {
		return nil, errors.New("a TCP address needs mutual TLS: set --tls-cert-file, --tls-key-file and --tls-ca-file")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("TLS client certificate %s / key %s: %w", certFile, keyFile, err)
	}
	pool, err := loadPool(caFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, RootCAs: pool}, nil
}
