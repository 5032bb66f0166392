// Command fenced-writer is the Go example of docs/fencing-kubernetes.md ("Commands that
// are not Rust"): a client-go program run by `tenure run --fence` writes fenced by its
// term's token with no tenure-specific code. It loads $KUBECONFIG, as every client-go
// program does; tenure points it at the term's endpoint.
//
//	fenced-writer NAMESPACE NAME
//
// creates the ConfigMap NAME with data.token = $TENURE_FENCING_TOKEN and exits 0, or prints
// the API server's (or tenure's) refusal and exits 1.
package main

import (
	"context"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: fenced-writer NAMESPACE NAME")
		os.Exit(2)
	}
	namespace, name := os.Args[1], os.Args[2]
	config, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubeconfig:", err)
		os.Exit(2)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(2)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Data:       map[string]string{"token": os.Getenv("TENURE_FENCING_TOKEN")},
	}
	if _, err := client.CoreV1().ConfigMaps(namespace).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		// A stale term: "tenure fencing: lease NS/NAME: stale: token 7 < current 8".
		fmt.Fprintln(os.Stderr, "refused:", err)
		os.Exit(1)
	}
	fmt.Println("go wrote", name)
}
