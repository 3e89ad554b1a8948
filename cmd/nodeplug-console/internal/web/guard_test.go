package web

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestGuard: the Host check (DNS rebinding), the method check and the
// token, each on its own, through a real HTTP server.
func TestGuard(t *testing.T) {
	token := NewToken()
	if len(token) != 64 || token == NewToken() {
		t.Fatalf("token %q: want 64 hex digits, new each time", token)
	}
	reached := 0
	g := NewGuard(token, "127.0.0.1", []string{"console.internal"})
	srv := httptest.NewServer(g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached++
		_, _ = w.Write([]byte("inside"))
	})))
	defer srv.Close()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	for _, tc := range []struct {
		name, method, host, path, auth, cookie string
		want                                   int
	}{
		{"token in header", "GET", "", "/plugins", "Bearer " + token, "", 200},
		{"token in cookie", "GET", "", "/plugins", "", token, 200},
		{"HEAD", "HEAD", "", "/plugins", "Bearer " + token, "", 200},
		{"localhost", "GET", "localhost:8080", "/plugins", "Bearer " + token, "", 200},
		{"name under .localhost", "GET", "console.localhost:8080", "/", "Bearer " + token, "", 200},
		{"IPv6 loopback", "GET", "[::1]:8080", "/", "Bearer " + token, "", 200},
		{"another loopback address", "GET", "127.0.0.2", "/", "Bearer " + token, "", 200},
		{"allowed extra host", "GET", "console.internal:80", "/", "Bearer " + token, "", 200},
		{"no token", "GET", "", "/plugins", "", "", 401},
		{"wrong token", "GET", "", "/plugins", "Bearer " + strings.Repeat("0", 64), "", 401},
		{"wrong cookie", "GET", "", "/events?view=plugins", "", "nope", 401},
		{"token of another length", "GET", "", "/", "Bearer " + token[:10], "", 401},
		{"foreign host, DNS rebinding", "GET", "attacker.example:8080", "/plugins", "Bearer " + token, "", 403},
		{"foreign host with the token in a cookie", "GET", "attacker.example", "/", "", token, 403},
		{"a LAN address", "GET", "192.168.1.10:8080", "/", "Bearer " + token, "", 403},
		{"empty host", "GET", " ", "/", "Bearer " + token, "", 403},
		{"POST", "POST", "", "/plugins", "Bearer " + token, "", 405},
		{"PUT", "PUT", "", "/plugins", "Bearer " + token, "", 405},
		{"DELETE", "DELETE", "", "/api/traces/1", "Bearer " + token, "", 405},
		{"POST without a token", "POST", "", "/plugins", "", "", 405},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := reached
			req, err := http.NewRequest(tc.method, srv.URL+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.host != "" {
				req.Host = tc.host
			}
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			if tc.cookie != "" {
				req.AddCookie(&http.Cookie{Name: CookieName, Value: tc.cookie})
			}
			resp, err := noRedirect.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.want)
			}
			if inside := reached > before; inside != (tc.want == 200) {
				t.Errorf("handler reached: %v, want %v", inside, tc.want == 200)
			}
			if tc.want == 405 && resp.Header.Get("Allow") != "GET, HEAD" {
				t.Errorf("Allow %q, want GET, HEAD", resp.Header.Get("Allow"))
			}
			if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") {
				t.Errorf("Content-Security-Policy %q", csp)
			}
		})
	}
}

// TestTokenInURLBecomesACookie: the first visit's ?token= sets an HttpOnly,
// SameSite=Strict cookie and redirects to the URL without the token; the
// cookie alone then opens the page.
func TestTokenInURLBecomesACookie(t *testing.T) {
	token := NewToken()
	srv := httptest.NewServer(NewGuard(token, "127.0.0.1", nil).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(r.URL.String()))
	})))
	defer srv.Close()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get(srv.URL + "/traces/abc?token=" + token + "&x=1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/traces/abc?x=1" {
		t.Fatalf("status %d, Location %q: want 303 to /traces/abc?x=1", resp.StatusCode, resp.Header.Get("Location"))
	}
	cookies := resp.Cookies()
	if len(cookies) != 1 || cookies[0].Name != CookieName || cookies[0].Value != token || !cookies[0].HttpOnly ||
		cookies[0].SameSite != http.SameSiteStrictMode || cookies[0].Path != "/" {
		t.Fatalf("cookies %+v: want one HttpOnly SameSite=Strict cookie with the token, path /", cookies)
	}
	req, _ := http.NewRequest("GET", srv.URL+"/traces/abc?x=1", nil)
	req.AddCookie(cookies[0])
	resp, err = noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("with the cookie: status %d", resp.StatusCode)
	}
	resp, err = noRedirect.Get(srv.URL + "/plugins?token=" + strings.Repeat("a", 64))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Fatalf("a wrong token in the URL: status %d, cookies %v; want 401 and none", resp.StatusCode, resp.Cookies())
	}
}

// TestListenHostIsAllowedButNotTheUnspecifiedAddress: the host of the
// listen address passes; 0.0.0.0 (inside a container) is not a name a
// browser should send.
func TestListenHostIsAllowedButNotTheUnspecifiedAddress(t *testing.T) {
	if !NewGuard("t", "10.1.2.3", nil).HostAllowed("10.1.2.3:8080") {
		t.Error("the listen address's host is refused")
	}
	if NewGuard("t", "0.0.0.0", nil).HostAllowed("0.0.0.0:8080") {
		t.Error("the unspecified address is allowed as a Host")
	}
	if !NewGuard("t", "0.0.0.0", nil).HostAllowed("127.0.0.1:18080") {
		t.Error("loopback refused when listening on every address")
	}
}
