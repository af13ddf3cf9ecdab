// Search results show a snippet of each page's text. Sphinx takes it from the element with role="main", which in
// sphinx-book-theme also holds the header's buttons ("System Settings Light Dark"): take it from the article instead.
(function () {
  function patch() {
    if (typeof Search === "undefined" || Search._fromArticle) return typeof Search !== "undefined";
    const original = Search.htmlToText;
    Search.htmlToText = (htmlString, anchor) => {
      const doc = new DOMParser().parseFromString(htmlString, "text/html");
      const article = doc.querySelector("article.bd-article");
      if (anchor || !article) return original(htmlString, anchor);
      article.querySelectorAll(".headerlink, script, style").forEach((el) => el.remove());
      return article.textContent;
    };
    Search._fromArticle = true;
    return true;
  }
  if (!patch()) document.addEventListener("DOMContentLoaded", patch);
})();
