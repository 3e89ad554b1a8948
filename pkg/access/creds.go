package access

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/credentials"
)

// UnixCred is what the kernel says of a Unix socket peer (SO_PEERCRED),
// with its supplementary groups when its process is visible.
type UnixCred struct {
	UID, GID uint32
	// PID is 0 when the peer is in another PID namespace.
	PID int32
	// Groups are the supplementary groups from /proc/<pid>/status (none
	// when the pid is not visible: then only UID and GID count).
	Groups []uint32
}

// UnixPolicy turns Unix credentials into roles.
type UnixPolicy struct {
	// OwnUID is the service's own uid: it and root get the internal role.
	OwnUID uint32
	// OperatorGIDs are the groups whose members get the operator role.
	OperatorGIDs []uint32
}

// Role returns the role of a Unix caller.
func (p UnixPolicy) Role(c UnixCred) Role {
	if c.UID == 0 || c.UID == p.OwnUID {
		return RoleInternal
	}
	for _, g := range p.OperatorGIDs {
		if c.GID == g || slices.Contains(c.Groups, g) {
			return RoleOperator
		}
	}
	return RoleReader
}

// peerCred reads the credentials of the peer of a Unix connection.
func peerCred(conn *net.UnixConn) (UnixCred, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return UnixCred{}, err
	}
	var uc *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		uc, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return UnixCred{}, err
	}
	if serr != nil {
		return UnixCred{}, fmt.Errorf("SO_PEERCRED: %w", serr)
	}
	c := UnixCred{UID: uc.Uid, GID: uc.Gid, PID: uc.Pid}
	if c.PID > 0 {
		c.Groups = procGroups(c.PID, c.UID)
	}
	return c, nil
}

// procGroups returns the supplementary groups of process pid, provided it
// still belongs to uid (the pid could have been reused); nil otherwise.
func procGroups(pid int32, uid uint32) []uint32 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/status")
	if err != nil {
		return nil
	}
	var groups []uint32
	owner := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		key, val, ok := bytes.Cut(sc.Bytes(), []byte(":"))
		if !ok {
			continue
		}
		fields := bytes.Fields(val)
		switch string(key) {
		case "Uid":
			// Real, effective, saved, filesystem: SO_PEERCRED gives the
			// effective uid at connect.
			owner = len(fields) > 1 && string(fields[1]) == strconv.FormatUint(uint64(uid), 10)
		case "Groups":
			for _, f := range fields {
				if g, err := strconv.ParseUint(string(f), 10, 32); err == nil {
					groups = append(groups, uint32(g))
				}
			}
		}
	}
	if !owner {
		return nil
	}
	return groups
}

// Credentials are the server transport credentials of an API server. On a
// Unix connection they identify the peer by SO_PEERCRED; on any other
// connection they run a TLS handshake requiring a verified client
// certificate, or, when no TLS is configured, admit the connection without
// an identity (the plain TCP listener for tests; the Guard decides what it
// may do).
type Credentials struct {
	Unix UnixPolicy
	// TLS, when set, is required on non-Unix connections.
	TLS *ServerTLS
}

var _ credentials.TransportCredentials = (*Credentials)(nil)

// ServerHandshake identifies the peer of conn.
func (c *Credentials) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if uc, ok := conn.(*net.UnixConn); ok {
		cred, err := peerCred(uc)
		if err != nil {
			return nil, nil, err
		}
		return conn, authInfo{
			CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
			caller:         Caller{Unix: &cred, Role: c.Unix.Role(cred)},
		}, nil
	}
	if c.TLS == nil {
		return conn, plainInfo{credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
	}
	cfg, err := c.TLS.config()
	if err != nil {
		return nil, nil, err
	}
	tc := tls.Server(conn, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = tc.Close()
		return nil, nil, err
	}
	st := tc.ConnectionState()
	if len(st.PeerCertificates) == 0 {
		_ = tc.Close()
		return nil, nil, errors.New("TLS client sent no certificate")
	}
	leaf := st.PeerCertificates[0]
	return tc, authInfo{
		CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
		caller:         Caller{Subject: leaf.Subject.String(), Role: RoleFromOrganizations(leaf.Subject.Organization)},
	}, nil
}

// ClientHandshake is not supported: these are server credentials.
func (c *Credentials) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("access.Credentials are server credentials")
}

// Info describes the protocol.
func (c *Credentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "nodeplug"}
}

// Clone returns a copy.
func (c *Credentials) Clone() credentials.TransportCredentials {
	cp := *c
	return &cp
}

// OverrideServerName is a no-op on server credentials.
func (c *Credentials) OverrideServerName(string) error { return nil }

// plainInfo is the AuthInfo of a connection admitted without an identity.
type plainInfo struct{ credentials.CommonAuthInfo }

func (plainInfo) AuthType() string { return "insecure" }
