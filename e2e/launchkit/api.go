package launchkit

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"time"
)

// APIClient makes GET requests of an API server, as a bearer of token, trusting only the CA
// given (5 s per request).
type APIClient struct {
	base  string
	c     *http.Client
	token string
}

// NewAPIClient is a client of the API server at base (https://HOST:PORT).
func NewAPIClient(base string, caPEM []byte, token string) *APIClient {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return &APIClient{
		base:  base,
		c:     &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}},
		token: token,
	}
}

// Get returns the status and the body (at most 4 MiB) of GET path; status 0 when there was no
// answer.
func (a *APIClient) Get(path string) (int, []byte) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, a.base+path, nil)
	if err != nil {
		return 0, nil
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := a.c.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return resp.StatusCode, b
}

// Status returns the status of GET path (0: no answer).
func (a *APIClient) Status(path string) int {
	code, _ := a.Get(path)
	return code
}

// Ready tells whether /readyz answers 200 and the default namespace exists.
func (a *APIClient) Ready() bool {
	return a.Status("/readyz") == http.StatusOK && a.Status("/api/v1/namespaces/default") == http.StatusOK
}
