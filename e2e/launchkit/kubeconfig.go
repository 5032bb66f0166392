package launchkit

import (
	"encoding/base64"
	"fmt"
)

// Kubeconfig is a kubeconfig of one cluster, one user and one context (named after the
// user, namespace default), with a bearer token or else a client certificate.
type Kubeconfig struct {
	Cluster string // the cluster's name
	Server  string // https://HOST:PORT
	CAPEM   []byte // the CA, PEM-encoded
	User    string
	Token   string
	Cert    string // a client certificate file, when there is no token
	Key     string // its key file
}

// Write writes the kubeconfig to path (0600).
func (k Kubeconfig) Write(path string) error {
	var cred string
	if k.Token != "" {
		cred = "    token: " + k.Token + "\n"
	} else {
		cred = "    client-certificate: " + k.Cert + "\n    client-key: " + k.Key + "\n"
	}
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: %[1]s
  cluster:
    server: %[2]s
    certificate-authority-data: %[3]s
users:
- name: %[4]q
  user:
%[5]scontexts:
- name: %[4]q
  context:
    cluster: %[1]s
    user: %[4]q
    namespace: default
current-context: %[4]q
`, k.Cluster, k.Server, base64.StdEncoding.EncodeToString(k.CAPEM), k.User, cred)
	return WriteFile(path, []byte(kc), 0o600)
}
